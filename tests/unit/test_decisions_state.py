"""Suspend, approve, deny and cancel; the closing message by template; the saved state."""

from __future__ import annotations

import msgspec
import pytest

from tests.unit.kit import Listed, World, call, go, make_job, read_tool, write_tool
from turnstile.jobs.budget import Budget
from turnstile.jobs.calls import plan_step_key
from turnstile.jobs.closing import closing_message, recorded_steps
from turnstile.jobs.decisions import approve, cancel, deny
from turnstile.jobs.errors import DecisionError, ParamsError, StateFormatError
from turnstile.jobs.outcomes import TERMINAL, Outcome, Status
from turnstile.jobs.runs import new_run
from turnstile.jobs.state import RunState
from turnstile.jobs.support.job import support_job
from turnstile.jobs.support.scenarios import BY_LETTER, run_scenario
from turnstile.jobs.support.shop import InMemoryShop
from turnstile.jobs.tools import ToolContext

AT = "2026-11-29T12:00:00Z"


def _held_run(world: World, **job_kw: object) -> tuple[RunState, object]:
    job = make_job([read_tool(world), write_tool(world, reversible=False)], **job_kw)  # type: ignore[arg-type]
    ran = go(job, Listed([call("update", "a", value=9)]))
    return ran.state, job


def test_an_irreversible_write_asks_a_person_and_runs_once_approved() -> None:
    """Policy allowed it, but the tool cannot be undone: the run suspends with the call held;
    approved, the held call runs first, under its original key, flagged as approved."""
    world = World()
    state, job = _held_run(world)
    assert (state.status, state.outcome) == (Status.SUSPENDED, Outcome.NEEDS_APPROVAL)
    assert state.pending is not None and state.pending.key == "r1:1.0"
    assert world.calls == []
    approve(state, by="ops@example.com", at=AT)
    assert state.decisions[-1].kind == "approved" and state.decisions[-1].by == "ops@example.com"
    ran = go(job, Listed([]), state=state)  # type: ignore[arg-type]
    assert ran.state.outcome is Outcome.COMPLETED
    assert world.calls == [("update", {"id": "a", "value": 9})]
    assert list(world.writes) == ["r1:1.0"]
    assert ran.state.usage.tool_calls == 1


def test_approval_binds_to_the_held_calls_arguments() -> None:
    state, _ = _held_run(World())
    with pytest.raises(DecisionError):
        approve(state, by="ops", at=AT, digest="0000000000000000")
    assert state.status is Status.SUSPENDED


def test_deny_ends_the_run_or_becomes_an_observation() -> None:
    world = World()
    state, job = _held_run(world)
    deny(state, job, by="ops", at=AT, reason="too risky")  # type: ignore[arg-type]
    assert (state.status, state.outcome, state.reason) == (
        Status.STOPPED,
        Outcome.APPROVAL_DENIED,
        "too risky",
    )
    lenient_state, lenient = _held_run(World(), deny_as_observation=True)
    deny(lenient_state, lenient, by="ops", at=AT, reason="use store credit")  # type: ignore[arg-type]
    assert lenient_state.status is Status.RUNNING
    assert lenient_state.last_result == {
        "status": "error",
        "code": "approval_denied",
        "detail": "use store credit",
    }
    assert world.calls == []


def test_decisions_that_do_not_apply_are_clear_errors() -> None:
    state, _ = _held_run(World())
    cancel(state, by="ops", at=AT)
    assert state.outcome is Outcome.CANCELLED
    with pytest.raises(DecisionError, match="not suspended"):
        approve(state, by="ops", at=AT)
    with pytest.raises(DecisionError, match="already ended"):
        cancel(state, by="ops", at=AT)


def test_outcomes_are_a_closed_set_with_two_non_terminal() -> None:
    """A run held for a person (a call to approve, a budget to extend) has not ended."""
    non_terminal = {o.value for o in Outcome} - {o.value for o in TERMINAL}
    assert non_terminal == {"needs_approval", "needs_budget"}
    assert len(Outcome) == 14  # diverged: an evaluation run that left its recording


def test_closing_messages_are_built_from_the_plan() -> None:
    """E did all the work and still ran out of time; F issued the refund but sent no email;
    H cannot say whether the refund happened. The message says exactly that, no model call."""
    job = run_scenario(BY_LETTER["A"]).runtime.job
    e = closing_message(run_scenario(BY_LETTER["E"]).state, job)
    assert e.startswith("We stopped before finishing: this request reached its time limit.")
    assert "the refund was issued; the confirmation email was sent" in e
    f = closing_message(run_scenario(BY_LETTER["F"]).state, job)
    assert (
        "its step limit" in f and "the refund was issued; the confirmation email was not sent" in f
    )
    h = closing_message(run_scenario(BY_LETTER["H"]).state, job)
    assert "we could not confirm whether the refund was issued" in h
    assert "the confirmation email was not sent" in h
    a = closing_message(run_scenario(BY_LETTER["A"]).state, job)
    assert a.startswith("Your request is complete.")
    for letter in "BCDG":
        assert closing_message(run_scenario(BY_LETTER[letter]).state, job)


def test_state_json_is_stable_and_round_trips() -> None:
    """The same state always gives the same bytes, and loading them gives the state back."""
    state = run_scenario(BY_LETTER["G"]).state
    data = state.to_json()
    again = RunState.from_json(data)
    assert again.to_json() == data
    assert again == state
    assert state.copy().to_json() == data


def test_unknown_schema_version_or_garbage_fails_fast() -> None:
    state = run_scenario(BY_LETTER["A"]).state
    raw = msgspec.json.decode(state.to_json())
    raw["schema_version"] = 99
    with pytest.raises(StateFormatError, match="schema version 99"):
        RunState.from_json(msgspec.json.encode(raw))
    with pytest.raises(StateFormatError):
        RunState.from_json(b"{not json")
    raw["schema_version"] = 1
    raw["usage"] = "lots"
    with pytest.raises(StateFormatError):
        RunState.from_json(msgspec.json.encode(raw))


def test_signature_tracks_facts_and_plan_statuses_only() -> None:
    state = run_scenario(BY_LETTER["A"]).state
    before = state.signature()
    state.last_result = {"status": "ok", "anything": 1}
    state.usage.tokens += 5
    assert state.signature() == before
    state.facts["x"] = 1
    assert state.signature() != before


def test_new_run_refuses_bad_input_before_anything_exists() -> None:
    job = make_job([])
    ok = dict(run_id="r", tenant="t", user_id="u", job=job, goal="g")
    for field, value in [
        ("tenant", ""),
        ("user_id", "  "),
        ("run_id", "a{b}"),
        ("goal", ""),
        ("goal", "x" * 5000),
    ]:
        with pytest.raises(ParamsError):
            new_run(**{**ok, field: value})  # type: ignore[arg-type]
    with pytest.raises(ParamsError, match="budget"):
        new_run(**ok, budget=Budget(max_steps=-1))  # type: ignore[arg-type]
    with pytest.raises(ParamsError, match=r"unknown model 'gpt-9'; one of policy"):
        new_run(**{**ok, "job": support_job(InMemoryShop())}, params={"model": "gpt-9"})  # type: ignore[arg-type]


def test_a_closing_message_says_what_the_shop_recorded() -> None:
    """A run cancelled while its refund is held says the refund was not issued, unless the
    shop records that refund under the step's key (a turn that died after the write and
    before its commit): then it says the refund was issued."""
    ran = run_scenario(BY_LETTER["G"])
    state, job = ran.state, ran.runtime.job
    held = state.pending
    assert held is not None and held.call.plan_step
    cancel(state, by="ops", at=AT)
    assert recorded_steps(state, job) == frozenset()
    assert "the refund was not issued" in closing_message(state, job)
    ctx = ToolContext(
        run_id=state.run_id, tenant=state.tenant, user_id=state.user_id, params=state.params,
        args=held.call.args, key=plan_step_key(state.run_id, held.call.plan_step),
        timeout_s=5, approved=True,
    )  # fmt: skip
    job.tools["issue_refund"].fn(ctx)
    recorded = recorded_steps(state, job)
    assert recorded == {held.call.plan_step}
    message = closing_message(state, job, recorded=recorded)
    assert message.startswith("Your request was cancelled.")
    assert "the refund was issued" in message and "not issued" not in message
