"""An evaluation run's tools answer from its origin's recording (jobs/recording.py): the
recorded calls are read from turn events, a matching call gets the recorded observation and
runs nothing, and a call the recording lacks is a live read, a held write or a divergence."""

from __future__ import annotations

from typing import Any

import pytest

from turnstile import Job, ToolContext, tool
from turnstile.jobs.loops import call_signature
from turnstile.jobs.model import Scripted
from turnstile.jobs.moves import Continue
from turnstile.jobs.outcomes import Outcome, Status
from turnstile.jobs.recording import Mode, answering, recorded_calls
from turnstile.jobs.state import Origin, RecordedCall, RunState
from turnstile.jobs.tools import ToolError, ToolOutput

RAN: list[str] = []


@tool(facts=("total",))
def read_order(ctx: ToolContext, order: str) -> dict[str, Any]:
    """Read an order."""
    RAN.append(f"read {order}")
    return {"total": 7}


@tool(mutates=True, charges={"refund_cents": "cents"})
def refund(ctx: ToolContext, order: str, cents: int) -> dict[str, Any]:
    """Refund an order."""
    RAN.append(f"refund {order}")
    return {"refunded": cents}


JOB = Job(
    name="recorded", model=Scripted(lambda view, i: {"type": "final"}),
    tools={t.name: t for t in (read_order, refund)}, dimensions=("refund_cents",),
)  # fmt: skip
RECORDED = [
    RecordedCall(turn=1, tool="read_order", args={"order": "o1"},
                 observation={"status": "ok", "result": {"total": 5}}),
    RecordedCall(turn=2, tool="read_order", args={"order": "o1"},
                 observation={"status": "ok", "result": {"total": 6}}),
    RecordedCall(turn=3, tool="refund", args={"order": "o1", "cents": 5},
                 observation={"status": "error", "code": "invalid_state", "detail": "paid"}),
]  # fmt: skip


def _state(mode: Mode | None) -> RunState:
    origin = Origin(run_id="run_o", tenant="t", turn=0, evaluation="ev_1",
                    mode=mode.value if mode else None, calls=RECORDED)  # fmt: skip
    return RunState(run_id="run_e", tenant="ev", user_id="u", job="recorded", goal="g",
                    origin=origin)  # fmt: skip


def _ctx(args: dict[str, Any]) -> ToolContext:
    return ToolContext("run_e", "ev", "u", {}, args, "k", 5.0)


def _call(state: RunState, name: str, args: dict[str, Any], job: Job) -> Any:
    signature = call_signature(name, args)
    state.seen[signature] = state.seen.get(signature, 0) + 1  # as the turn counts a proposal
    return job.tools[name].fn(_ctx(args))


def test_recorded_calls_pair_each_call_span_with_its_observation() -> None:
    """A turn of one call: `last_result` is its observation; a batch: the n-th item, without
    its call number and tool name. Plan turns (no call spans) record nothing."""
    events: list[dict[str, Any]] = [
        {"type": "submitted"},
        {"type": "turn", "step": 1, "spans": [{"id": "t1.model", "kind": "model"}],
         "last_result": None},
        {"type": "turn", "step": 2, "last_result": {"status": "ok", "result": 1},
         "spans": [{"id": "t2.c1", "kind": "tool", "name": "a", "attrs": {"args": {"x": 1}}}]},
        {"type": "turn", "step": 3, "spans": [
            {"id": "t3.c2", "kind": "tool", "name": "b", "attrs": {"args": {}}},
            {"id": "t3.c1", "kind": "tool", "name": "a", "attrs": {"args": {"x": 2}}}],
         "last_result": [{"call": 1, "tool": "a", "status": "ok", "result": 2},
                         {"call": 2, "tool": "b", "status": "error", "code": "nope"}]},
    ]  # fmt: skip
    assert recorded_calls(events) == [
        RecordedCall(turn=2, tool="a", args={"x": 1}, observation={"status": "ok", "result": 1}),
        RecordedCall(turn=3, tool="a", args={"x": 2}, observation={"status": "ok", "result": 2}),
        RecordedCall(turn=3, tool="b", args={}, observation={"status": "error", "code": "nope"}),
    ]


def test_a_run_without_a_recording_keeps_its_job() -> None:
    assert answering(JOB, _state(None)).job is JOB


@pytest.mark.parametrize("mode", list(Mode))
def test_a_recorded_call_gets_the_kth_recorded_observation_and_runs_nothing(mode: Mode) -> None:
    """The first proposal of read_order(o1) gets the first recording, the second the second,
    a third the last again; the refund's recorded error is raised as the tool said it."""
    RAN.clear()
    state = _state(mode)
    job = answering(JOB, state).job
    assert [_call(state, "read_order", {"order": "o1"}, job) for _ in range(3)] == [
        {"total": 5}, {"total": 6}, {"total": 6},
    ]  # fmt: skip
    with pytest.raises(ToolError) as said:
        _call(state, "refund", {"order": "o1", "cents": 5}, job)
    assert (said.value.code, said.value.detail) == ("invalid_state", "paid")
    assert RAN == []


def test_replay_reads_runs_a_new_read_live_and_holds_a_new_write_charging_nothing() -> None:
    RAN.clear()
    state = _state(Mode.REPLAY_READS)
    answered = answering(JOB, state)
    job = answered.job
    assert _call(state, "read_order", {"order": "o2"}, job) == {"total": 7}
    held = _call(state, "refund", {"order": "o1", "cents": 900}, job)
    assert held["held"] is True
    assert RAN == ["read o2"]  # the read ran, the write did not
    assert job.tools["refund"].charges == {} and job.tools["refund"].cost_bound_microusd == 0
    assert answered.settle(state, Continue()) == Continue()


def test_stop_on_divergence_runs_nothing_and_ends_the_run_diverged() -> None:
    RAN.clear()
    state = _state(Mode.STOP_ON_DIVERGENCE)
    answered = answering(JOB, state)
    with pytest.raises(ToolError, match="not_executed"):
        _call(state, "read_order", {"order": "o9"}, answered.job)
    assert RAN == []
    answered.settle(state, Continue())
    assert (state.status, state.outcome) == (Status.STOPPED, Outcome.DIVERGED)
    assert state.reason is not None and 'read_order {"order":"o9"}' in state.reason


def test_a_recorded_envelope_comes_back_as_the_tool_gave_it() -> None:
    """An observation that is not a plain value's (needs_approval, unknown, a raised tool's)
    is given back as a ToolOutput of that very envelope."""
    state = _state(Mode.REPLAY_READS)
    assert state.origin is not None
    state.origin.calls = [
        RecordedCall(
            turn=1,
            tool="read_order",
            args={"order": "o1"},
            observation={"status": "error", "code": "tool_raised", "detail": "x"},
        )
    ]
    out = _call(state, "read_order", {"order": "o1"}, answering(JOB, state).job)
    assert isinstance(out, ToolOutput)
    assert out.result == {"status": "error", "code": "tool_raised", "detail": "x"}
