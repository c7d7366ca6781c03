"""What the ledger answers: typed, frozen values. A rejection is a result, not an error."""

from __future__ import annotations

from typing import Literal

import msgspec

from turnstile.ledger.inputs import Period

ReserveStatus = Literal["admitted", "rejected", "unavailable", "conflict"]


class Rejection(msgspec.Struct, frozen=True, kw_only=True):
    """One hard dimension that did not fit: what was asked and what was left."""

    dimension: str
    requested: int
    available: int


class ReserveResult(msgspec.Struct, frozen=True, kw_only=True):
    """The answer to a reserve.

    `admitted` is True only for status "admitted". "unavailable" (the server did not answer)
    and "conflict" (the id was admitted before with other amounts) admit nothing: a hard limit
    treats both as a denial. `rejected` lists every hard dimension that did not fit, in
    dimension order (steps, tool_calls, tokens, cost_microusd, then others alphabetically).
    """

    status: ReserveStatus
    admitted: bool
    rejected: tuple[Rejection, ...] = ()
    soft_exceeded: tuple[str, ...] = ()
    expires_at_ms: int | None = None
    replayed: bool = False
    detail: str = ""

    @property
    def first_rejected(self) -> str | None:
        """The dimension to name in budget_exhausted(tenant.<dimension>)."""
        return self.rejected[0].dimension if self.rejected else None


class SettleResult(msgspec.Struct, frozen=True, kw_only=True):
    """The answer to a settle or release.

    `overage` holds, per dimension, the actual usage above the reserved amount (committed all
    the same). `corrected` is True when the reservation had expired and been charged in full,
    and this settlement replaced that charge with the actual.
    """

    replayed: bool
    overage: dict[str, int]
    corrected: bool = False


class CeilingResult(msgspec.Struct, frozen=True, kw_only=True):
    op_id: str
    replayed: bool


class DimensionState(msgspec.Struct, frozen=True, kw_only=True):
    """One dimension of a tenant in its current period bucket. `ceiling` None is unlimited."""

    ceiling: int | None
    committed: int
    reserved: int
    hard: bool
    period: Period
    bucket: str


class RebuildResult(msgspec.Struct, frozen=True, kw_only=True):
    pending: int
    corrected_fields: int


class Change(msgspec.Struct, frozen=True, kw_only=True):
    """One usage figure moved by a journal entry."""

    dimension: str
    bucket: str
    committed_delta: int
    reserved_delta: int


class JournalEntry(msgspec.Struct, frozen=True, kw_only=True):
    """One change of a tenant's ledger, as the scripts wrote it.

    `op` is reserve, settle, release, expire, set_ceiling or rebuild; `id` the reservation or
    operation id. `fields` keeps everything else the entry carries (deadline_ms, overage,
    corrects, and for set_ceiling: dimension, ceiling, hard, period).
    """

    entry_id: str
    op: str
    id: str
    at_ms: int
    changes: tuple[Change, ...]
    fields: dict[str, str]
