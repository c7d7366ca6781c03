"""A turn's ledger holds, as the worker takes and settles them: the hold its load took (or one
taken now), the larger batch a turn asks for mid-turn (`LedgerGate`), the hold of a run whose
turn would pass a soft ceiling it may extend, and the settlement that shares a turn's actual
usage among its holds."""

from __future__ import annotations

from turnstile.errors import StoreUnavailableError
from turnstile.jobs.budget import Usage
from turnstile.jobs.extensions import TENANT, tenant_hold
from turnstile.jobs.state import HeldBudget, RunState
from turnstile.ledger import replies as ledger_replies
from turnstile.ledger.client import Ledger
from turnstile.ledger.results import ReserveResult
from turnstile.worker.broker.message import StepMessage
from turnstile.worker.store.runs import Loaded, RunStore


class LedgerDown(StoreUnavailableError):  # noqa: N818 - the ledger is down, said plainly
    """The ledger did not answer: hard limits fail closed, the step is retried later."""


class LedgerGate:
    """Asks the tenant's ledger for a batch larger than the turn's allowance, before it runs.
    The hold is recorded on the run (the next commit settles or releases it), and taken only
    while the run is still at the version the turn loaded."""

    def __init__(self, store: RunStore, msg: StepMessage, reservation_id: str, timeout_s: float):
        self.store, self.msg, self.reservation_id, self.timeout_s = (
            store,
            msg,
            reservation_id,
            timeout_s,
        )
        self.reserved: Usage | None = None
        self.rejected: str | None = None  # the dimension that refused, for tenant.<dimension>

    def extend(self, extra: Usage) -> bool:
        """Admitted or not. An unreachable ledger is no refusal (the run would end as if its
        tenant were out of budget): the step is retried, as when the load finds it down. A run
        that moved on past the turn's version takes no hold."""
        _, argv = self.store.ledger.reserve_script_args(
            self.msg.tenant, self.reservation_id, extra.ledger_amounts(), timeout_s=self.timeout_s
        )
        result = self.store.hold(self.msg.tenant, self.msg.run_id, self.msg.version, argv)
        if result is None:
            return False
        if result.status == "unavailable":
            raise LedgerDown(result.detail)
        if result.admitted:
            self.reserved = extra
        self.rejected = result.first_rejected
        return result.admitted


def turn_hold(
    store: RunStore, msg: StepMessage, loaded: Loaded, *, reservation_id: str, worst: Usage,
    hard_s: float,
) -> ReserveResult:  # fmt: skip
    """The ledger's answer for this turn's hold: the one the load took, or, for a run that
    carries no hold (one written before holds were), a reservation taken now."""
    ledger = store.ledger
    if loaded.hold in ("admitted", "rejected", "conflict") and loaded.hold_id == reservation_id:
        if ledger_replies.needs_index(loaded.hold_reply):
            ledger.index_tenant(msg.tenant)
        return ledger_replies.reserve(loaded.hold_reply)
    _, argv = ledger.reserve_script_args(
        msg.tenant, reservation_id, worst.ledger_amounts(), timeout_s=hard_s
    )
    taken = store.hold(msg.tenant, msg.run_id, msg.version, argv)
    if taken is None:  # the run moved on since the load: this turn will not commit
        return ReserveResult(status="conflict", admitted=False, detail="the run moved on")
    return taken


def soft_hold(ledger: Ledger, state: RunState, worst: Usage, soft: list[str]) -> HeldBudget | None:
    """The hold of a run whose turn would take the tenant past soft ceilings it (or the job)
    made extendable: what the tenant spent and holds (the turn's own hold left out), what the
    turn needs, the ceiling. None if no such ceiling is left."""
    rows = ledger.read(state.tenant)
    amounts = worst.ledger_amounts()
    held = {}
    for d in soft:
        row = rows.get(d)
        if row is not None and row.ceiling is not None and not row.hard:
            used = max(0, row.committed + row.reserved - amounts.get(d, 0))
            held[f"{TENANT}{d}"] = (used, amounts.get(d, 0), row.ceiling)
    if not held:
        return None
    reason = "the next turn would pass the tenant's soft " + ", ".join(soft) + " ceiling"
    return tenant_hold(state, held, reason)


def give_back(ledger: Ledger, tenant: str, reservation_id: str, worst: Usage) -> list[str]:
    """The settlement that gives a hold back whole (nothing was spent under it)."""
    zero = {d: 0 for d in worst.ledger_amounts()}
    return ledger.settle_script_args(tenant, reservation_id, zero)[1]


def split_actual(actual: Usage, holds: list[tuple[str, Usage]]) -> list[tuple[str, Usage]]:
    """Share a turn's actual usage among its holds, each taking up to what it reserved; the
    last takes whatever is left (an overage is booked, and flagged, on it)."""
    left = actual.ledger_amounts()
    out = []
    last = len(holds) - 1
    for index, (reservation_id, held) in enumerate(holds):
        share = left
        if index != last:
            limit = held.ledger_amounts()
            share = {d: min(v, limit.get(d, 0)) for d, v in left.items()}
            left = {d: v - share[d] for d, v in left.items()}
        out.append((reservation_id, Usage.from_ledger_amounts(share)))
    return out


def settlements(
    ledger: Ledger, tenant: str, actual: Usage, holds: list[tuple[str, Usage]]
) -> list[list[str]]:
    """The settlements of a turn's holds (ledger_settle's ARGV each), its actual usage shared
    among them."""
    return [
        ledger.settle_script_args(tenant, rid, share.ledger_amounts())[1]
        for rid, share in split_actual(actual, holds)
    ]
