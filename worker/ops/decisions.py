"""An operator's decisions on a run (approve, deny, cancel; approve with new limits for a run
held `needs_budget`), checked before the client is asked: a run that ended, holds no call, or
is not waiting for an extension is refused with a line saying why. And `resolve`,
a run's tenant and hash by its id, which every command about one run starts from."""

from __future__ import annotations

from collections.abc import Mapping

from turnstile.errors import DecisionRefusedError, RunNotFoundError
from turnstile.jobs.outcomes import Outcome, Status
from turnstile.jobs.state import RunState
from turnstile.worker.client._client import Client
from turnstile.worker.store import fields


def _decidable(run_id: str, stored: dict[str, str], verb: str) -> None:
    status = stored.get(fields.STATUS, "")
    if status == Status.STOPPED.value:
        raise DecisionRefusedError(
            f"run {run_id} already ended {stored.get(fields.OUTCOME) or 'stopped'}: "
            f"there is nothing to {verb}"
        )
    if verb == "extend" and (
        status != Status.SUSPENDED.value or stored.get(fields.OUTCOME) != Outcome.NEEDS_BUDGET.value
    ):
        why = stored.get(fields.OUTCOME) if status == Status.SUSPENDED.value else status
        raise DecisionRefusedError(
            f"run {run_id} is {why or status}: it is not waiting for a budget extension"
        )
    if verb != "cancel" and status != Status.SUSPENDED.value:
        raise DecisionRefusedError(
            f"run {run_id} is {status}, not suspended: it holds no call to {verb}"
        )


def approve(
    c: Client,
    run_id: str,
    *,
    by: str,
    digest: str | None = None,
    tenant: str | None = None,
    extend: Mapping[str, int] | None = None,
) -> RunState:
    """Approve exactly the held call: the one with `digest`, or (`digest` None: an operator's
    command that named none) the one held now. For a run held `needs_budget`, approve the
    extension `extend` (new limits; None: the hold's suggestion) of the hold with `digest`, or
    of the one held now. An empty digest (a form or a body that sent one without its value) is
    refused: it names no call, and must not stand for whatever is held."""
    if digest is not None and not digest.strip():
        raise DecisionRefusedError(
            f"an empty digest names no held call of run {run_id}: give the digest the run"
            " shows for its held call (pending.digest)"
        )
    tenant, stored = resolve(c, run_id, tenant)
    _decidable(run_id, stored, "approve" if extend is None else "extend")
    state = RunState.from_json(stored[fields.STATE])
    held = state.held_budget or state.pending
    if digest is None and held is not None:
        digest = held.digest
    return c.approve(run_id, by=by, digest=digest, extend=extend)


def deny(c: Client, run_id: str, *, by: str, reason: str, tenant: str | None = None) -> RunState:
    tenant, stored = resolve(c, run_id, tenant)
    _decidable(run_id, stored, "deny")
    return c.deny(run_id, by=by, reason=reason)


def cancel(c: Client, run_id: str, *, by: str, reason: str, tenant: str | None = None) -> str:
    """ "cancelled" (at once: no turn of the run is in flight) or "requested" (a turn is in
    flight: the run ends at its next turn boundary)."""
    tenant, stored = resolve(c, run_id, tenant)
    _decidable(run_id, stored, "cancel")
    return c.cancel(run_id, by=by, reason=reason)


# -- reading runs ---------------------------------------------------------------------------


def resolve(c: Client, run_id: str, tenant: str | None = None) -> tuple[str, dict[str, str]]:
    """The run's tenant and hash. Scoped to a tenant, a run of another tenant is not found."""
    if tenant is not None:
        stored = c.store.hash(tenant, run_id)
        if not stored:
            raise RunNotFoundError(f"no run {run_id!r} for tenant {tenant!r}")
        return tenant, stored
    return c.run_hash(run_id)
