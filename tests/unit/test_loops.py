"""Loop detection: the repeat limit, period-2 oscillation and no progress, and its precedence
over budget ceilings."""

from __future__ import annotations

from typing import Any

from tests.unit.kit import Listed, World, call, go, make_job, read_tool
from turnstile.jobs.budget import Budget
from turnstile.jobs.loops import call_signature, oscillating
from turnstile.jobs.model import ModelRequest, ModelResponse
from turnstile.jobs.outcomes import Outcome
from turnstile.jobs.tools import ToolContext


def test_signature_ignores_call_ids_and_argument_order() -> None:
    """The same intent has one signature whatever the call id or the key order."""
    assert call_signature("f", {"a": 1, "b": [1, 2]}) == call_signature("f", {"b": [1, 2], "a": 1})
    assert call_signature("f", {"a": 1}) != call_signature("f", {"a": 2})
    assert call_signature("f", {"a": 1}) != call_signature("g", {"a": 1})


def test_loop_detection_beats_the_turn_ceiling() -> None:
    """The same call ten times under a nine-turn ceiling ends loop_detected."""
    world = World()
    ran = go(make_job([read_tool(world)]), Listed([call("lookup")] * 10), Budget(max_steps=9))
    assert ran.state.outcome is Outcome.LOOP_DETECTED
    assert ran.state.detail == "repeated_call"
    assert ran.state.usage.steps == 3
    assert len(world.calls) == 2  # the third proposal is stopped before it runs


def test_repeat_reached_in_the_last_admitted_turn_names_the_loop() -> None:
    """When the repeat threshold is reached in the very turn that also uses the last step,
    the loop names the outcome."""
    ran = go(make_job([read_tool(World())]), Listed([call("lookup")] * 10), Budget(max_steps=3))
    assert (ran.state.outcome, ran.state.detail, ran.state.usage.steps) == (
        Outcome.LOOP_DETECTED,
        "repeated_call",
        3,
    )


def test_ceiling_before_the_repeat_is_proposed_names_the_budget() -> None:
    """When the turn ceiling refuses a turn before the repeating proposal exists, nothing has
    repeated yet: the budget names the outcome. Both orderings are pinned."""
    ran = go(make_job([read_tool(World())]), Listed([call("lookup")] * 10), Budget(max_steps=2))
    assert (ran.state.outcome, ran.state.detail, ran.state.usage.steps) == (
        Outcome.BUDGET_EXHAUSTED,
        "steps",
        2,
    )


def _login_page(ctx: ToolContext) -> dict[str, Any]:
    """A 403 rendered as HTML with a fresh request id: new text every time, same intent."""
    request_id = f"req-{len(ctx.key) * 7919 + hash(ctx.key) % 10_000}"
    return {"status": "error", "code": "http_403", "detail": f"<html>Sign in ({request_id})</html>"}


class Costly(Listed):
    """Reports provider usage so each turn costs exactly the illustrative amount."""

    def __init__(self, replies: list[Any], costs: list[int]) -> None:
        super().__init__(replies)
        self.costs = costs

    def next(self, request: ModelRequest) -> ModelResponse:
        base = super().next(request)
        cost = self.costs[min(len(self.requests), len(self.costs)) - 1]
        return ModelResponse(base.reply, base.latency_s, input_tokens=cost, output_tokens=0)


FREE_TOKENS = dict(
    input_microusd_per_mtok=1_000_000,  # one micro-dollar an input token: usage reads as cost
    output_microusd_per_mtok=0,
    max_tokens=10_000_000,
    max_cost_microusd=10_000_000,
    deadline_ms=10_000_000,
    max_tool_calls=100,
)


def _incident_run(budget: Budget) -> Any:
    world = World()
    tools = [
        read_tool(world, "read_incident"),
        read_tool(world, "fetch_dashboard", result=_login_page),
    ]
    replies = [call("read_incident", "inc-7")] + [call("fetch_dashboard", "deploy-42")] * 30
    return go(make_job(tools), Costly(replies, [41_000, 49_000, 51_000, 54_000]), budget)


def test_spec_002_loop_failure_turn_by_turn() -> None:
    """The login page differs every time, the canonical signature does
    not; the third proposal, at turn four, stops the run at $0.195."""
    ran = _incident_run(Budget(max_repeat=2, max_steps=20, max_stalls=100, **FREE_TOKENS))
    assert (ran.state.outcome, ran.state.detail) == (Outcome.LOOP_DETECTED, "repeated_call")
    assert ran.state.usage.steps == 4
    assert ran.state.usage.cost_microusd == 195_000


def test_spec_002_without_the_detector_the_turn_ceiling_blames_capacity() -> None:
    """With only a twenty-turn ceiling the same run costs $1.059 and ends budget_exhausted."""
    ran = _incident_run(Budget(max_repeat=100, max_steps=20, max_stalls=100, **FREE_TOKENS))
    assert (ran.state.outcome, ran.state.detail) == (Outcome.BUDGET_EXHAUSTED, "steps")
    assert ran.state.usage.cost_microusd == 1_059_000


def test_period_two_oscillation_stops_at_the_configured_depth() -> None:
    """A B A B ... stops when the alternation fills the configured window, before the call
    that would complete it runs."""
    for window in (4, 6):
        world = World()
        job = make_job([read_tool(world, "search_logs"), read_tool(world, "fetch_dashboard")])
        replies = [call("search_logs", "q"), call("fetch_dashboard", "d")] * 10
        budget = Budget(
            max_repeat=100,
            max_stalls=100,
            max_steps=20,
            max_tool_calls=20,
            oscillation_window=window,
        )
        ran = go(job, Listed(replies), budget)
        assert (ran.state.outcome, ran.state.detail) == (Outcome.LOOP_DETECTED, "oscillation")
        assert ran.state.usage.steps == window
        assert len(world.calls) == window - 1


def test_oscillation_needs_two_different_calls() -> None:
    assert oscillating(["a", "b", "a", "b"], window=4)
    assert not oscillating(["a", "a", "a", "a"], window=4)
    assert not oscillating(["a", "b", "a", "c"], window=4)
    assert not oscillating(["a", "-", "a", "-"], window=4)
    assert not oscillating(["b", "a", "b"], window=4)


def test_no_progress_catches_varied_arguments() -> None:
    """Arguments that change every turn defeat the repeat limit; the stall counter does not."""
    world = World()
    not_found = read_tool(world, result=lambda ctx: {"status": "error", "code": "not_found"})
    ran = go(make_job([not_found]), Listed([call("lookup", f"id{i}") for i in range(10)]))
    assert (ran.state.outcome, ran.state.detail, ran.state.usage.steps) == (
        Outcome.LOOP_DETECTED,
        "no_progress",
        3,
    )
