"""Deciding on a run (`Deciding`, which `Client` is made of): approve or deny what a
suspended run holds (a call, or a budget to extend), cancel a run. Each decision is applied
to the state by the kernel (jobs/decisions.py) and written through the store's version
compare-and-set; a run that goes on gets its next step, sent after the write."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from turnstile.errors import DecisionRefusedError
from turnstile.jobs.decisions import approve as kernel_approve
from turnstile.jobs.decisions import cancel as kernel_cancel
from turnstile.jobs.decisions import deny as kernel_deny
from turnstile.jobs.errors import KernelError
from turnstile.jobs.extensions import TENANT, is_tenant
from turnstile.jobs.outcomes import Status
from turnstile.jobs.state import RunState
from turnstile.ledger.results import DimensionState
from turnstile.worker.broker.message import StepMessage
from turnstile.worker.client._room import call_charges, no_room
from turnstile.worker.client._submit import Sending
from turnstile.worker.scheduling.limits import next_hold
from turnstile.worker.store.runs import Change, now_iso

CANCEL_TRIES = 5  # a run that moves on under a cancel this often is refused; try again


def _check_extension_allowed(
    tenant: str,
    state: RunState,
    limits: Mapping[str, int],
    ledger: Mapping[str, DimensionState],
    max_deadline_ms: int,
) -> None:
    """An extension never passes the tenant's hard ceilings: no new limit above a hard
    ceiling, and no more room for the run than the tenant has left under one. Only the run's
    own limits are extended (and the deadline only up to the most a run may have)."""
    for name, limit in limits.items():
        if is_tenant(name):  # a ceiling of the tenant's: only a soft one is ever extended
            dimension = name.removeprefix(TENANT)
            row = ledger.get(dimension)
            if row is None or row.ceiling is None:
                raise DecisionRefusedError(f"tenant {tenant!r} has no {dimension} ceiling now")
            if row.hard:
                raise DecisionRefusedError(
                    f"tenant {tenant!r}'s {dimension} ceiling is hard now: it is never extended"
                )
            continue
        if name == "deadline_ms":
            if limit > max_deadline_ms:
                raise DecisionRefusedError(
                    f"deadline_ms={limit} is above the {max_deadline_ms} ms a run may have"
                )
            continue
        row = ledger.get(name)
        if row is None or not row.hard or row.ceiling is None:
            continue
        if limit > row.ceiling:
            raise DecisionRefusedError(
                f"{name}={limit} would pass tenant {tenant!r}'s hard {name} ceiling of "
                f"{row.ceiling}: it is never extended"
            )
        more = limit - int(getattr(state.usage, name))
        left = max(0, row.ceiling - row.committed - row.reserved)
        if more > left:
            raise DecisionRefusedError(
                f"{name}={limit} would let the run spend {more} more {name}; tenant "
                f"{tenant!r} has {left} left under its hard ceiling of {row.ceiling}"
            )


class Deciding(Sending):
    """Decisions on runs, for `Client`."""

    if TYPE_CHECKING:  # the Client's `Reading` part (worker/client/_reading.py)

        def run_hash(
            self, run_id: str, tenant: str | None = None
        ) -> tuple[str, dict[str, str]]: ...

    def _decide(
        self,
        run_id: str,
        by: str,
        apply: Callable[[RunState], dict[str, Any]],
        *,
        if_idle: bool = False,
    ) -> RunState:
        tenant, stored = self.run_hash(run_id)
        state = RunState.from_json(stored["state"])
        try:
            event = apply(state)
        except KernelError as exc:
            raise DecisionRefusedError(str(exc)) from exc
        at = state.decisions[-1].at if state.decisions else now_iso()
        event.update(by=by, at=at)  # the decision's own time: the record and the state agree
        events = [event]
        if state.status is Status.STOPPED:  # a denial or a cancel ends the run here and now
            left = self.store.leave(
                tenant=tenant, run_id=run_id, version=int(stored["version"]),
                old_status=stored["status"], state=state, events=events, at=at,
                clear=["cancel_by", "cancel_reason"], if_idle=if_idle,
            )  # fmt: skip
            if left.kind != "ok":
                raise DecisionRefusedError(
                    f"run {run_id} changed while deciding ({left.kind}); try again"
                )
            return state
        live = state.status is Status.RUNNING
        committed = self.store.commit(
            Change(
                tenant=tenant, run_id=run_id, version=int(stored["version"]),
                old_status=stored["status"], status=state.status.value,
                state_json=state.to_json().decode(),
                outcome=state.outcome.value if state.outcome else "",
                detail=state.detail or "", reason=state.reason or "",
                lease_ms=int(self.config.pickup_lease_s * 1000) if live else None,
                events=events,
                hold=next_hold(
                    self.ledger, self.config, state, self.jobs.get(state.job),
                    version=int(stored["version"]) + 1,
                ) if live else "-",
            )
        )  # fmt: skip
        if committed.kind != "ok":
            raise DecisionRefusedError(
                f"run {run_id} changed while deciding ({committed.kind}); try again"
            )
        if live:  # a broker that does not take the step leaves it to the sweeper (self.deferred)
            self._send(StepMessage(tenant, run_id, committed.version, stored["queue"]), state)
        return state

    def _raise_soft_ceilings(
        self,
        tenant: str,
        digest: str,
        limits: Mapping[str, int],
        ledger: Mapping[str, DimensionState],
    ) -> None:
        """An extension of the tenant's soft ceilings (`tenant.<dimension>`), set before the
        run is resumed, so its step is admitted under them. Idempotent per hold: the same
        extension again is a replay; another one for the same hold is a LedgerConflict."""
        for name, limit in limits.items():
            if is_tenant(name):
                dimension = name.removeprefix(TENANT)
                row = ledger[dimension]
                if row.ceiling is not None and row.ceiling >= limit:
                    continue  # raised as far since the hold: an extension never lowers it
                self.ledger.set_ceiling(
                    tenant, dimension, limit, hard=False, period=row.period.value,
                    op_id=f"extend:{digest}:{dimension}",
                )  # fmt: skip

    def approve(
        self,
        run_id: str,
        *,
        by: str,
        digest: str | None = None,
        extend: Mapping[str, int] | None = None,
    ) -> RunState:
        """Approve what a suspended run holds (`state.held`, either kind; its `digest` pins
        it). A call: exactly that tool with those arguments; the run goes on. A budget (a run
        held `needs_budget`): an extension, `extend` mapping amounts (steps, tool_calls, tokens,
        cost_microusd, deadline_ms) to new limits (None: the hold's suggestion); the run
        re-admits with them. Refused (DecisionRefusedError) if the run is not suspended, holds
        another call or hold, the call charges a dimension whose hard ceiling has no room left
        for it, or the extension would pass a hard ceiling of its tenant's; nothing is written
        then."""

        def apply(state: RunState) -> dict[str, Any]:
            held = state.held_budget
            kernel_approve(state, by=by, at=now_iso(), digest=digest, extend=extend)
            decision = state.decisions[-1]
            if held is not None:
                assert decision.limits is not None
                ledger = self.ledger.read(state.tenant)
                _check_extension_allowed(
                    state.tenant, state, decision.limits, ledger,
                    int(self.config.max_deadline_s * 1000),
                )  # fmt: skip
                self._raise_soft_ceilings(state.tenant, held.digest, decision.limits, ledger)
                return {"type": "decision", "kind": "extended", "digest": decision.digest,
                        "dimensions": held.dimensions, "limits": decision.limits}  # fmt: skip
            assert state.approval is not None
            self._check_affordable(state)
            return {"type": "decision", "kind": "approved", "digest": state.approval.digest}

        return self._decide(run_id, by, apply)

    def _check_affordable(self, state: RunState) -> None:
        """A held call its tenant cannot afford under a hard ceiling is not approved: the run
        would end `budget_exhausted` at once, the call never made (worker/client/_room.py)."""
        charges = call_charges(state, self.jobs.get(state.job))
        if state.pending is None or not charges:
            return
        ledger = self.ledger.read(state.tenant)
        why = no_room(state.tenant, state.pending.call.name, charges, ledger)
        if why is not None:
            raise DecisionRefusedError(f"cannot approve run {state.run_id}: {why}")

    def deny(self, run_id: str, *, by: str, reason: str) -> RunState:
        """Deny the call a suspended run holds: the run ends `approval_denied`, or, for a job
        that shows denials to its model, goes on with the denial as the call's result. Denying
        a run held `needs_budget` stops it `budget_exhausted`, naming the dimension."""

        def apply(state: RunState) -> dict[str, Any]:
            held = state.held_budget
            kernel_deny(state, self.jobs.get(state.job), by=by, at=now_iso(), reason=reason)
            event: dict[str, Any] = {"type": "decision", "kind": "denied", "reason": reason}
            if held is not None:  # a budget hold: the run ends budget_exhausted
                event.update(digest=held.digest, dimensions=held.dimensions)
            return event

        return self._decide(run_id, by, apply)

    def cancel(self, run_id: str, *, by: str, reason: str = "cancelled by an operator") -> str:
        """Cancelled at once ("cancelled") unless a turn of the run is in flight; then
        "requested": the run is cancelled at its next turn boundary. Both go through the
        store's version compare-and-set, so a cancel never lands on a run that moved on."""
        for _ in range(CANCEL_TRIES):
            tenant, stored = self.run_hash(run_id)
            status = stored["status"]
            if status == Status.STOPPED.value:
                raise DecisionRefusedError(
                    f"cannot cancel run {run_id}: it already ended {stored.get('outcome')}"
                )

            def apply(state: RunState) -> dict[str, Any]:
                kernel_cancel(state, by=by, at=now_iso(), reason=reason)
                return {"type": "decision", "kind": "cancelled", "reason": reason}

            try:
                self._decide(run_id, by, apply, if_idle=True)
                return "cancelled"
            except DecisionRefusedError:
                pass  # a turn is in flight, or the run moved on: look again
            if status == Status.RUNNING.value and stored.get("cancel_by"):
                return "requested"  # asked before; the step at the boundary will see it
            if status == Status.RUNNING.value:
                marked = self.store.mark(
                    tenant, run_id, version=int(stored["version"]), status=status,
                    fields={"cancel_by": by, "cancel_reason": reason},
                    event={"type": "cancel_requested", "by": by, "reason": reason,
                           "at": now_iso()},
                )  # fmt: skip
                if marked.kind == "ok":
                    return "requested"
        raise DecisionRefusedError(f"run {run_id} kept changing while cancelling; try again")
