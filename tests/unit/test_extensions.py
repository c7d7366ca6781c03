"""Budgets a person can extend, in the kernel: a run out of an extendable dimension suspends
`needs_budget` with what it spent, what the next turn needs and a suggestion; an extension
with the hold's digest raises its limits and the run goes on; a denial ends it
`budget_exhausted`; an extension that does not apply is refused and changes nothing."""

from __future__ import annotations

import pytest

from tests.unit.kit import Listed, World, call, go, make_job, read_tool, write_tool
from turnstile.jobs.budget import Budget
from turnstile.jobs.decisions import approve, cancel, deny
from turnstile.jobs.errors import DecisionError, JobDefinitionError
from turnstile.jobs.extensions import parse_limits
from turnstile.jobs.job import Job
from turnstile.jobs.kernel import Suspended
from turnstile.jobs.outcomes import TERMINAL, Outcome, Status
from turnstile.jobs.state import HeldBudget, RunState

AT = "2026-12-02T12:00:00Z"
REPLIES = [call("lookup", f"k{i}") for i in range(19)]
BUDGET = Budget(max_tokens=700, max_output_tokens=100, max_steps=20, max_tool_calls=20)


def _job(*extendable: str) -> Job:
    return make_job([read_tool(World(), latency_s=0.1)], extendable=extendable)


def _held(*extendable: str) -> tuple[RunState, Job, HeldBudget]:
    job = _job(*extendable)
    ran = go(job, Listed(REPLIES, latency_s=0.1), BUDGET)
    assert isinstance(ran.move, Suspended), ran.state.outcome
    assert ran.state.held_budget is not None
    return ran.state, job, ran.state.held_budget


def test_out_of_an_extendable_dimension_the_run_suspends_with_what_it_spent_and_needs() -> None:
    state, _, held = _held("tokens")
    assert (state.status, state.outcome, state.detail) == (
        Status.SUSPENDED, Outcome.NEEDS_BUDGET, "tokens",
    )  # fmt: skip
    assert Outcome.NEEDS_BUDGET not in TERMINAL
    assert held.kind == "budget" and held.dimensions == ["tokens"]
    assert held.spent["tokens"] == state.usage.tokens and held.limits["tokens"] == 700
    assert held.spent["tokens"] + held.needed["tokens"] > 700  # the next turn does not fit
    assert held.suggested == {"tokens": held.spent["tokens"] + held.needed["tokens"] + 350}
    assert len(held.digest) == 16 and "tokens budget" in held.reason


def test_not_extendable_the_run_ends_budget_exhausted_as_before() -> None:
    ran = go(_job(), Listed(REPLIES, latency_s=0.1), BUDGET)
    assert (ran.state.outcome, ran.state.detail) == (Outcome.BUDGET_EXHAUSTED, "tokens")
    assert ran.state.held_budget is None
    # Extendable in another dimension only: still the end.
    ran = go(_job("cost", "steps"), Listed(REPLIES, latency_s=0.1), BUDGET)
    assert ran.state.outcome is Outcome.BUDGET_EXHAUSTED


def test_an_extension_with_the_digest_raises_the_limit_and_the_run_goes_on() -> None:
    state, job, held = _held("tokens")
    approve(state, by="ops", at=AT, digest=held.digest, extend={"tokens": 5000})
    assert (state.status, state.outcome, state.held_budget) == (Status.RUNNING, None, None)
    assert state.budget.max_tokens == 5000
    decision = state.decisions[-1]
    assert (decision.kind, decision.digest, decision.limits) == ("extended", held.digest,
                                                                 {"tokens": 5000})  # fmt: skip
    ran = go(job, Listed([], latency_s=0.1), state=state)
    assert ran.state.outcome is Outcome.COMPLETED


def test_no_limits_given_the_suggestion_is_approved() -> None:
    state, _, held = _held("tokens")
    approve(state, by="ops", at=AT)
    assert state.budget.max_tokens == held.suggested["tokens"]


def test_a_denial_ends_the_run_budget_exhausted_naming_the_dimension() -> None:
    state, job, held = _held("tokens")
    deny(state, job, by="ops", at=AT, reason="enough spent")
    assert (state.status, state.outcome, state.detail) == (
        Status.STOPPED, Outcome.BUDGET_EXHAUSTED, "tokens",
    )  # fmt: skip
    assert "enough spent" in (state.reason or "")
    assert state.decisions[-1].kind == "denied" and state.decisions[-1].digest == held.digest


@pytest.mark.parametrize(
    ("extend", "digest", "message"),
    [
        ({"tokens": 9000}, "0000000000000000", "is held at"),  # a stale digest
        ({"tokens": 600}, None, "below the run's limit"),
        ({"tokens": 701}, None, "leaves no room for the next turn"),
        ({"max_tokens": 9000}, None, "cannot extend 'max_tokens'"),
        ({"tokens": -1}, None, "whole number"),
        ({"tokens": True}, None, "whole number"),
        ({"tokens": 2**60}, None, "whole number"),
        ({}, None, "at least one new limit"),
    ],
)
def test_an_extension_that_does_not_apply_is_refused_and_changes_nothing(
    extend: dict[str, object], digest: str | None, message: str
) -> None:
    state, _, _ = _held("tokens")
    before = state.to_json()
    with pytest.raises(DecisionError, match=message):
        approve(state, by="ops", at=AT, digest=digest, extend=extend)
    assert state.to_json() == before


def test_a_run_held_by_its_own_limit_cannot_extend_a_tenant_ceiling() -> None:
    """Only a soft ceiling of the tenant's that holds the run may be named."""
    state, _, held = _held("tokens", "tenant.tokens")
    with pytest.raises(DecisionError, match=r"cannot extend 'tenant\.tokens'"):
        approve(state, by="ops", at=AT, digest=held.digest, extend={"tenant.tokens": 10**6})


def test_an_extension_on_a_run_not_waiting_for_one_is_refused() -> None:
    state, _, _ = _held("tokens")
    cancel(state, by="ops", at=AT)
    with pytest.raises(DecisionError, match="not suspended"):
        approve(state, by="ops", at=AT, extend={"tokens": 9000})


def test_an_extension_of_a_run_holding_a_call_is_refused() -> None:
    job = make_job([write_tool(World(), reversible=False)], extendable=("tokens",))
    state = go(job, Listed([call("update", "a", value=1)])).state
    assert state.outcome is Outcome.NEEDS_APPROVAL
    with pytest.raises(DecisionError, match="not waiting for an extension"):
        approve(state, by="ops", at=AT, extend={"tokens": 9000})


def test_a_hold_survives_the_saved_state() -> None:
    state, _, held = _held("tokens")
    again = RunState.from_json(state.to_json())
    assert again.held_budget == held and again.extendable == ["tokens"]


def test_bad_names_are_refused_where_they_are_declared_or_typed() -> None:
    with pytest.raises(JobDefinitionError, match="not a budget dimension"):
        _job("tokenz")
    with pytest.raises(JobDefinitionError, match="tuple of names"):
        make_job([], extendable="tokens")
    assert parse_limits(["tokens=50000", "deadline_ms=90000"]) == {
        "tokens": 50000, "deadline_ms": 90000,
    }  # fmt: skip
    assert _job("tenant.tokens", "tokens").extendable == ("tenant.tokens", "tokens")
    assert parse_limits(["tenant.refund_cents=900"]) == {"tenant.refund_cents": 900}
    with pytest.raises(JobDefinitionError, match="not a budget dimension"):
        _job("tenant.Tokens")
    for bad in ("tokens", "tokens=-5", "tokens=1.5", "tokens=", "power=3", "tenant.=3"):
        with pytest.raises(DecisionError, match="bad extension"):
            parse_limits([bad])
