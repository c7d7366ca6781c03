"""A person's decisions on a run: approve the held call, deny it, or cancel the run.

Each is a pure change of the state, recorded with who decided and when. The caller supplies
the time, as the kernel has no clock of its own.
"""

from __future__ import annotations

from turnstile.jobs.errors import DecisionError
from turnstile.jobs.job import Job
from turnstile.jobs.outcomes import Outcome, Status
from turnstile.jobs.state import Decision, RunState
from turnstile.jobs.tools import error


def _held(state: RunState, verb: str) -> None:
    if state.status is not Status.SUSPENDED or state.pending is None:
        raise DecisionError(
            f"cannot {verb} run {state.run_id}: it is {state.status}, not suspended"
        )


def approve(state: RunState, *, by: str, at: str, digest: str | None = None) -> None:
    """Approve exactly the held call. With a digest, it must be the held call's: an approval
    given for other arguments approves nothing."""
    _held(state, "approve")
    assert state.pending is not None
    if digest is not None and digest != state.pending.digest:
        raise DecisionError(
            f"approval is for call {digest}, but the held call is {state.pending.digest}"
        )
    decision = Decision(kind="approved", by=by, at=at, digest=state.pending.digest)
    state.approval = decision
    state.decisions.append(decision)
    state.status, state.outcome, state.reason, state.detail = Status.RUNNING, None, None, None


def deny(state: RunState, job: Job, *, by: str, at: str, reason: str) -> None:
    """Deny the held call: the run ends approval_denied, or, for a job that allows it, the
    model is shown the denial and may choose another route."""
    _held(state, "deny")
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
    state.status = Status.STOPPED
    state.outcome, state.reason, state.detail = Outcome.CANCELLED, reason, None
