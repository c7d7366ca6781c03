"""A person's decisions on a run: approve the held call, deny it, or cancel the run; for a run
held `needs_budget`, approve new limits (an extension) or deny it (the run ends
`budget_exhausted`, naming the dimension).

Each is a pure change of the state, recorded with who decided and when. The caller supplies
the time, as the kernel has no clock of its own.
"""

from __future__ import annotations

from collections.abc import Mapping

from turnstile.jobs.errors import DecisionError
from turnstile.jobs.extensions import extended_budget
from turnstile.jobs.job import Job
from turnstile.jobs.outcomes import Outcome, Status
from turnstile.jobs.state import Decision, RunState
from turnstile.jobs.tools import error


def _held(state: RunState, verb: str) -> None:
    if state.status is not Status.SUSPENDED or (
        state.pending is None and state.held_budget is None
    ):
        raise DecisionError(
            f"cannot {verb} run {state.run_id}: it is {state.status}, not suspended"
        )


def approve(
    state: RunState,
    *,
    by: str,
    at: str,
    digest: str | None = None,
    extend: Mapping[str, object] | None = None,
) -> None:
    """Approve exactly the held call, or, for a run held `needs_budget`, the extension `extend`
    (new limits by amount name; the hold's suggestion when None). With a digest, it must be
    the hold's: an approval given for other arguments, or an earlier hold, approves nothing."""
    _held(state, "approve")
    if state.held_budget is not None:
        _extend(state, by=by, at=at, digest=digest, limits=extend)
        return
    if extend is not None:
        raise DecisionError(
            f"run {state.run_id} holds a call for approval, not a budget: it is not waiting "
            "for an extension"
        )
    assert state.pending is not None
    if digest is not None and digest != state.pending.digest:
        raise DecisionError(
            f"approval is for call {digest}, but the held call is {state.pending.digest}"
        )
    decision = Decision(kind="approved", by=by, at=at, digest=state.pending.digest)
    state.approval = decision
    state.decisions.append(decision)
    state.status, state.outcome, state.reason, state.detail = Status.RUNNING, None, None, None


def _extend(
    state: RunState, *, by: str, at: str, digest: str | None, limits: Mapping[str, object] | None
) -> None:
    held = state.held_budget
    assert held is not None
    if digest is not None and digest != held.digest:
        raise DecisionError(
            f"extension is for hold {digest}, but run {state.run_id} is held at {held.digest}"
        )
    budget, checked = extended_budget(state, held.suggested if limits is None else limits)
    decision = Decision(kind="extended", by=by, at=at, digest=held.digest, limits=checked)
    state.budget = budget
    state.held_budget = None
    state.decisions.append(decision)
    state.status, state.outcome, state.reason, state.detail = Status.RUNNING, None, None, None


def deny(state: RunState, job: Job, *, by: str, at: str, reason: str) -> None:
    """Deny the held call: the run ends approval_denied, or, for a job that allows it, the
    model is shown the denial and may choose another route. Denying a budget hold stops the
    run `budget_exhausted`, naming the dimension."""
    _held(state, "deny")
    if state.held_budget is not None:
        held = state.held_budget
        state.decisions.append(
            Decision(kind="denied", by=by, at=at, digest=held.digest, reason=reason)
        )
        state.held_budget = None
        state.status, state.outcome = Status.STOPPED, Outcome.BUDGET_EXHAUSTED
        state.reason, state.detail = f"{held.reason}; not extended: {reason}", held.dimensions[0]
        return
    assert state.pending is not None
    state.decisions.append(
        Decision(kind="denied", by=by, at=at, digest=state.pending.digest, reason=reason)
    )
    if job.deny_as_observation:
        state.last_result = error("approval_denied", reason)
        state.pending = None
        state.status, state.outcome, state.reason, state.detail = Status.RUNNING, None, None, None
        return
    state.status = Status.STOPPED
    state.outcome, state.reason, state.detail = Outcome.APPROVAL_DENIED, reason, None


def cancel(state: RunState, *, by: str, at: str, reason: str = "cancelled by an operator") -> None:
    if state.status is Status.STOPPED:
        raise DecisionError(f"cannot cancel run {state.run_id}: it already ended {state.outcome}")
    state.decisions.append(Decision(kind="cancelled", by=by, at=at, reason=reason))
    state.held_budget = None
    state.status = Status.STOPPED
    state.outcome, state.reason, state.detail = Outcome.CANCELLED, reason, None
