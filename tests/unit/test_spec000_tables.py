"""The reference scenarios' printed results, reproduced by the kernel: the scenario table, the
trace of scenario A, the post-mortems, the state view against the transcript, suspend and
resume, and replay."""

from __future__ import annotations

import json
from typing import Any

import pytest

from turnstile.jobs.budget import Budget
from turnstile.jobs.clock import SimClock
from turnstile.jobs.decisions import approve
from turnstile.jobs.job import render_view
from turnstile.jobs.kernel import run
from turnstile.jobs.model import Recorder, Replay
from turnstile.jobs.outcomes import Outcome, Status
from turnstile.jobs.state import RunState
from turnstile.jobs.support.scenarios import BY_LETTER, InProcess, Scenario, run_scenario, start
from turnstile.jobs.support.shop import InMemoryShop
from turnstile.jobs.trace import Trace, postmortem

# scenario: (outcome, detail, steps, tool_calls, tokens, elapsed_s, effects), as first printed
SCENARIO_TABLE: dict[str, tuple[str, str | None, int, int, int, float, list[list[Any]]]] = {
    "A": (
        "completed",
        None,
        5,
        3,
        708,
        10.0,
        [["refund", "ord_1001", 3000], ["email", "ord_1001"]],
    ),
    "B": ("loop_detected", "repeated_call", 3, 2, 192, 5.3, []),
    "C": ("loop_detected", "no_progress", 3, 3, 192, 5.7, []),
    "D": ("budget_exhausted", "tokens", 4, 4, 3584, 9.2, []),
    "E": (
        "budget_exhausted",
        "deadline",
        5,
        3,
        550,
        30.0,
        [["refund", "ord_1001", 3000], ["email", "ord_1001"]],
    ),
    "F": ("budget_exhausted", "steps", 3, 2, 393, 6.1, [["refund", "ord_1001", 3000]]),
    "G": ("needs_approval", None, 3, 2, 393, 6.1, []),
    "H": ("unknown_outcome", None, 3, 2, 393, 30.0, [["refund", "ord_1001", 3000]]),
}


@pytest.mark.parametrize("letter", sorted(SCENARIO_TABLE))
def test_scenario_row_matches_spec(letter: str) -> None:
    """Each scenario ends with its reference stop (mapped to the closed set) and its numbers."""
    result = run_scenario(BY_LETTER[letter])
    state = result.state
    outcome, detail, steps, tool_calls, tokens, elapsed_s, effects = SCENARIO_TABLE[letter]
    assert state.outcome == outcome
    assert state.detail == detail
    assert state.usage.steps == steps
    assert state.usage.tool_calls == tool_calls
    assert state.usage.tokens == tokens
    assert state.usage.elapsed_ms == round(elapsed_s * 1000)
    assert result.effects == effects


def test_g_suspends_and_everything_else_is_stopped() -> None:
    """G is suspended, resumable; every other scenario is stopped for good."""
    for letter in SCENARIO_TABLE:
        state = run_scenario(BY_LETTER[letter]).state
        expected = Status.SUSPENDED if letter == "G" else Status.STOPPED
        assert state.status is expected, letter


def test_trace_of_scenario_a_matches_spec() -> None:
    """Scenario A's spans: times, token counts and parents as in the reference trace table."""
    trace = run_scenario(BY_LETTER["A"]).trace
    rows = [(s.kind, s.name, s.parent, round(s.t0, 1), round(s.t1 or 0, 1)) for s in trace.spans]
    assert rows == [
        ("task", "t1", None, 0.0, 10.0),
        ("turn", "turn 1", "task", 0.0, 1.5),
        ("model", "model.next", "t1", 0.0, 1.5),
        ("turn", "turn 2", "task", 1.5, 3.4),
        ("model", "model.next", "t2", 1.5, 3.0),
        ("tool", "get_order", "t2", 3.0, 3.4),
        ("turn", "turn 3", "task", 3.4, 6.1),
        ("model", "model.next", "t3", 3.4, 4.9),
        ("tool", "issue_refund", "t3", 4.9, 6.1),
        ("turn", "turn 4", "task", 6.1, 8.5),
        ("model", "model.next", "t4", 6.1, 7.6),
        ("tool", "send_status_email", "t4", 7.6, 8.5),
        ("turn", "turn 5", "task", 8.5, 10.0),
        ("model", "model.next", "t5", 8.5, 10.0),
    ]
    models = [
        (s.attrs["input_tokens"], s.attrs["output_tokens"])
        for s in trace.spans
        if s.kind == "model"
    ]
    assert models == [(40, 52), (100, 23), (144, 34), (132, 25), (135, 23)]
    refund = next(s for s in trace.spans if s.name == "issue_refund")
    assert refund.attrs["args"] == {
        "order_id": "ord_1001",
        "amount_cents": 3000,
        "reason": "damaged",
    }


POSTMORTEMS = {
    "B": (
        ["get_order", "not_found"],
        ["get_order", '{"order_id": "ord_9999"}', 2],
        4.5,
        0.8,
        [40, 49, 49],
    ),
    "C": (
        ["get_order", "not_found"],
        ["get_order", '{"order_id": "ord_9001"}', 1],
        4.5,
        1.2,
        [40, 49, 49],
    ),
    "D": (
        None,
        ["search_policy", '{"order_id": "x", "q": "returns policy 1"}', 1],
        6.0,
        3.2,
        [41, 1149, 1149, 1149],
    ),
    "H": (
        ["issue_refund", "timeout"],
        ["get_order", '{"order_id": "ord_1001"}', 1],
        4.5,
        25.5,
        [40, 100, 144],
    ),
}


@pytest.mark.parametrize("letter", sorted(POSTMORTEMS))
def test_postmortem_matches_spec(letter: str) -> None:
    """B, C, D and H post-mortems: first error, most repeated call, time split, input sizes."""
    summary = postmortem(run_scenario(BY_LETTER[letter]).trace.spans)
    first_error, most_repeated, model_s, tool_s, inputs = POSTMORTEMS[letter]
    assert summary == {
        "first_error": first_error,
        "most_repeated": most_repeated,
        "model_s": model_s,
        "tool_s": tool_s,
        "input_tokens_by_turn": inputs,
    }


def test_state_view_against_full_transcript() -> None:
    """The reference memory table: the view holds at 1,149 tokens while replaying the transcript
    grows to 7,979 at step 8; 8,084 against 32,080 in total, as the closed form says."""
    scenario = Scenario(
        "D8",
        "large results, generous budget",
        {"model": "search_loop"},
        Budget(max_steps=8, max_tool_calls=20, max_stalls=10, max_tokens=100_000),
    )
    spans = run_scenario(scenario).trace.spans
    models = [s for s in spans if s.kind == "model"]
    results = {s.parent: s.attrs["result_tokens"] for s in spans if s.kind == "tool"}
    s0 = models[0].attrs["input_tokens"]
    transcript, cum_view, cum_transcript, rows = s0, 0, 0, []
    for m in models:
        cum_view += m.attrs["input_tokens"]
        cum_transcript += transcript
        rows.append((m.attrs["input_tokens"], transcript, cum_view, cum_transcript))
        transcript += m.attrs["output_tokens"] + results.get(m.parent, 0)
    assert rows == [
        (41, 41, 41, 41),
        (1149, 1175, 1190, 1216),
        (1149, 2309, 2339, 3525),
        (1149, 3443, 3488, 6968),
        (1149, 4577, 4637, 11545),
        (1149, 5711, 5786, 17256),
        (1149, 6845, 6935, 24101),
        (1149, 7979, 8084, 32080),
    ]
    n, d = len(models), results[models[0].parent] + models[0].attrs["output_tokens"]
    assert (n, s0, d) == (8, 41, 1134)
    assert n * s0 + d * n * (n - 1) // 2 == 32080


def _resume(saved: bytes, shop: InMemoryShop) -> InProcess:
    again = start(BY_LETTER["G"], shop=shop)
    again.state = RunState.from_json(saved)
    run(again.state, again.runtime)
    again.runtime.close()
    return again


def test_suspend_and_resume_matches_spec() -> None:
    """G suspends at step 3 with the refund held; approved and resumed from its saved JSON it
    completes at step 5 with 708 tokens and 11.2 s carried over; a second resume of the same
    snapshot issues no second refund."""
    first = run_scenario(BY_LETTER["G"])
    state = first.state
    assert (state.status, state.outcome, state.usage.steps) == (
        Status.SUSPENDED,
        Outcome.NEEDS_APPROVAL,
        3,
    )
    assert state.pending is not None
    assert state.pending.call.name == "issue_refund"
    assert state.pending.call.args["amount_cents"] == 8000
    assert first.effects == []

    approve(
        state, by="reviewer@example.com", at="2026-11-29T12:00:00Z", digest=state.pending.digest
    )
    saved = state.to_json()  # the checkpoint: the process could exit here

    resumed = _resume(saved, first.shop)
    assert (resumed.state.status, resumed.state.outcome) == (Status.STOPPED, Outcome.COMPLETED)
    assert (resumed.state.usage.steps, resumed.state.usage.tool_calls) == (5, 4)
    assert (resumed.state.usage.tokens, resumed.state.usage.elapsed_ms) == (708, 11_200)
    effects = [["refund", "ord_1004", 8000], ["email", "ord_1004"]]
    assert resumed.effects == effects

    twice = _resume(saved, first.shop)
    assert twice.state.outcome is Outcome.COMPLETED
    assert twice.effects == effects
    assert first.shop.orders(first.state.tenant, "t1")["ord_1004"].refunded_cents == 8000


@pytest.mark.parametrize(("letter", "outcome"), [("A", "completed"), ("C", "loop_detected")])
def test_replay_reaches_the_same_state(letter: str, outcome: str) -> None:
    """A recorded run replayed without its model ends in byte-identical state JSON and the
    same effects: a normal run, and a stuck one."""
    live = start(BY_LETTER[letter])
    recorder = Recorder(live.runtime.model)
    live.runtime.model = recorder
    run(live.state, live.runtime)
    replayed = run_scenario(BY_LETTER[letter], model=Replay(recorder.responses))
    assert live.state.outcome == replayed.state.outcome == outcome
    assert live.state.to_json() == replayed.state.to_json()
    assert live.effects == replayed.effects


def test_view_is_the_state_not_the_history() -> None:
    """The first view of scenario A is the reference 40-token view: goal, empty plan and facts,
    no last result, and the remaining budgets."""
    state = start(BY_LETTER["A"]).state
    state_view = render_view(state)
    view = json.loads(state_view)
    assert view == {
        "goal": "refund the damaged item on order ord_1001",
        "plan": [],
        "facts": {},
        "last_result": None,
        "remaining": {"steps": 8, "tool_calls": 6, "tokens": 4000},
    }
    assert (len(state_view) + 3) // 4 == 40


def test_simulated_clock_is_the_only_time() -> None:
    """Runs on a simulated clock are instant and repeatable: two runs, same bytes."""
    a = run_scenario(BY_LETTER["E"]).state.to_json()
    b = run_scenario(BY_LETTER["E"]).state.to_json()
    assert a == b
    assert isinstance(Trace(SimClock()).clock.now(), float)
