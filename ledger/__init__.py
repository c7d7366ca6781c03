"""The tenant ledger: atomic multi-dimension reservations in Redis, one Lua script per operation.

ledger = Ledger.from_url("redis://localhost:6379/0")
ledger.set_ceiling("acme", "cost_microusd", 100_000_000, period="day")
held = ledger.reserve("acme", "run-7:3", {"cost_microusd": 20_000_000}, timeout_s=120)
if held.admitted:
    ledger.settle("acme", "run-7:3", {"cost_microusd": 14_000_000})
"""

from turnstile.ledger.client import Ledger, connect
from turnstile.ledger.errors import (
    LedgerConflict,
    LedgerError,
    LedgerInputError,
    LedgerProtocolError,
    LedgerUnavailable,
    LedgerUnknownReservation,
)
from turnstile.ledger.inputs import DEFAULT_DIMENSIONS, MAX_AMOUNT, Period
from turnstile.ledger.results import (
    CeilingResult,
    Change,
    DimensionState,
    JournalEntry,
    RebuildResult,
    Rejection,
    ReserveResult,
    SettleResult,
)

__all__ = [
    "DEFAULT_DIMENSIONS",
    "MAX_AMOUNT",
    "CeilingResult",
    "Change",
    "DimensionState",
    "JournalEntry",
    "Ledger",
    "LedgerConflict",
    "LedgerError",
    "LedgerInputError",
    "LedgerProtocolError",
    "LedgerUnavailable",
    "LedgerUnknownReservation",
    "Period",
    "RebuildResult",
    "Rejection",
    "ReserveResult",
    "SettleResult",
    "connect",
]
