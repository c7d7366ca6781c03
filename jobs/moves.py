"""A turn's next move, as data: continue, finished with an outcome, or suspended for a person
(a held call to approve, a budget to extend); and the moves a state makes (`finish`,
`current_move`, `out_of_budget`)."""

from __future__ import annotations

from dataclasses import dataclass

from turnstile.jobs.budget import Usage
from turnstile.jobs.extensions import hold_for
from turnstile.jobs.outcomes import Outcome, Resource, Status
from turnstile.jobs.state import HeldBudget, HeldCall, RunState


@dataclass(frozen=True)
class Continue:
    pass


@dataclass(frozen=True)
class Finished:
    outcome: Outcome
    reason: str
    detail: str | None = None


@dataclass(frozen=True)
class Suspended:
    held: HeldCall | HeldBudget  # a call for a person to approve, or a budget to extend


Move = Continue | Finished | Suspended


def finish(state: RunState, outcome: Outcome, reason: str, detail: str | None = None) -> Move:
    detail = None if detail is None else str(detail)  # a Resource or Detector, kept as text
    state.outcome, state.reason, state.detail = outcome, reason, detail
    if outcome is Outcome.NEEDS_APPROVAL:
        state.status = Status.SUSPENDED
        assert state.pending is not None
        return Suspended(state.pending)
    if outcome is Outcome.NEEDS_BUDGET:
        state.status = Status.SUSPENDED
        assert state.held_budget is not None
        return Suspended(state.held_budget)
    state.status = Status.STOPPED
    return Finished(outcome, reason, detail)


def current_move(state: RunState) -> Move:
    if state.status is Status.STOPPED:
        assert state.outcome is not None
        return Finished(state.outcome, state.reason or "", state.detail)
    if state.status is Status.SUSPENDED and state.held_budget is not None:
        return Suspended(state.held_budget)
    if state.status is Status.SUSPENDED and state.pending is not None:
        return Suspended(state.pending)
    return Continue()


def out_of_budget(state: RunState, reserve: Usage, unfit: Resource, reason: str) -> Move:
    """`reserve` does not fit the run's budget: the run suspends `needs_budget`, held for a
    person, when every dimension it does not fit is extendable (`state.extendable`); else it
    ends `budget_exhausted`, naming `unfit`."""
    held = hold_for(state, reserve, reason)
    if held is None:
        return finish(state, Outcome.BUDGET_EXHAUSTED, reason, unfit)
    state.held_budget = held
    return finish(state, Outcome.NEEDS_BUDGET, reason, ",".join(held.dimensions))


def status_of(move: Move) -> str:
    if isinstance(move, Finished):
        return move.detail or move.outcome.value
    if isinstance(move, Suspended):
        budget = isinstance(move.held, HeldBudget)
        return (Outcome.NEEDS_BUDGET if budget else Outcome.NEEDS_APPROVAL).value
    return "ok"
