"""Where a run came from, and tools that answer from another run's recording.

A fork (`turnstile fork`) starts a new run from the recorded state after a turn of another run;
its `origin` says which run and which turn. An evaluation run (`turnstile eval`) is a fork
whose origin also carries that run's recorded tool calls and a mode: a call that matches a
recorded one (same tool, same arguments) gets the recorded observation and runs nothing; a
call that does not is handled by the mode. Either way a write is never executed: in
`replay-reads` a read runs live and a write is held (the model sees `{"held": true}`), in
`stop-on-divergence` nothing runs and the run ends `diverged` at the end of the turn.

All of it is data handed to the run (its state's `origin`) and pure functions over it: the
kernel still takes its tools as arguments, and the step wraps the job's tools with `answering`.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import msgspec

from turnstile.jobs.job import Job
from turnstile.jobs.loops import call_signature
from turnstile.jobs.moves import Move, finish
from turnstile.jobs.outcomes import Outcome
from turnstile.jobs.state import Origin, RecordedCall, RunState
from turnstile.jobs.tools import Tool, ToolContext, ToolError, ToolOutput, one_line

__all__ = ["HELD", "Answering", "Mode", "Origin", "RecordedCall", "answering", "recorded_calls"]

HELD = "held"  # a held write's observation: {"held": true, "detail": ...}
_CALL_SPAN = re.compile(r"^t(\d+)\.c(\d+)$")  # a turn's n-th call (jobs/batch.py)


class Mode(StrEnum):
    """How an evaluation handles a call that is not in the recording."""

    REPLAY_READS = "replay-reads"  # a read runs live, a write is held (never executed)
    STOP_ON_DIVERGENCE = "stop-on-divergence"  # nothing runs; the run ends `diverged`


def recorded_calls(events: list[dict[str, Any]]) -> list[RecordedCall]:
    """Every tool call a run's turn events recorded, with its observation, in turn order.
    A turn's n-th call span (`t<turn>.c<n>`) pairs with its n-th observation (`last_result`
    is the observation itself for a turn of one call, a list for a batch)."""
    out: list[RecordedCall] = []
    for event in events:
        if event.get("type") != "turn":
            continue
        calls = []
        for span in event.get("spans") or []:
            found = _CALL_SPAN.match(str(span.get("id", "")))
            if span.get("kind") == "tool" and found:
                calls.append((int(found.group(2)), span))
        result = event.get("last_result")
        for index, span in sorted(calls, key=lambda pair: pair[0]):
            if len(calls) == 1 and not isinstance(result, list):
                observation = result
            elif isinstance(result, list) and index <= len(result):
                item = result[index - 1]
                observation = {k: v for k, v in item.items() if k not in ("call", "tool")}
            else:
                continue  # the turn's observations are not the calls' (a refused batch)
            args = (span.get("attrs") or {}).get("args") or {}
            out.append(RecordedCall(turn=int(event.get("step") or 0), tool=span["name"],
                                    args=args, observation=observation))  # fmt: skip
    return out


def _answer(observation: Any) -> Any:
    """What the wrapped tool returns so the kernel observes exactly the recorded observation:
    a plain value for `{"status": "ok", "result": v}` (its facts are read from `v`, as they
    were), a ToolError for a tool's error, the envelope itself otherwise."""
    if not isinstance(observation, Mapping):
        return ToolOutput(observation)  # not an observation: the kernel says bad_result
    if observation.get("status") == "ok" and set(observation) == {"status", "result"}:
        return observation["result"]
    if observation.get("status") == "error" and observation.get("code") != "tool_raised":
        raise ToolError(str(observation.get("code")), observation.get("detail"))
    return ToolOutput(dict(observation), latency_s=0.0)


@dataclass
class Answering:
    """A run's tools answering from its origin's recording (or the job as it is, for a run
    that has none), and what the turn met: the first call not in the recording."""

    job: Job
    origin: Origin | None = None
    diverged: str | None = None  # the first call of this turn not in the recording

    def settle(self, state: RunState, move: Move) -> Move:
        """After the turn: a run that met a call not in the recording in stop-on-divergence
        mode ends `diverged` (nothing of that call ran)."""
        origin = self.origin
        if self.diverged is None or origin is None or state.terminal:
            return move
        reason = (
            f"turn {state.usage.steps}: {self.diverged} is not in the recording of run "
            f"{origin.run_id}"
        )
        state.pending = None  # nothing is held: the call never ran
        state.held_budget = None
        return finish(state, Outcome.DIVERGED, reason, "evaluation")


def answering(job: Job, state: RunState) -> Answering:
    """The job as the run's turn sees it: for an evaluation run (its origin has a mode), every
    tool answers from the recording; for any other run, the job unchanged."""
    origin = state.origin
    if origin is None or origin.mode is None:
        return Answering(job)
    out = Answering(job, origin)
    by_call: dict[str, list[Any]] = {}
    for call in origin.calls:
        by_call.setdefault(call_signature(call.tool, call.args), []).append(call.observation)
    mode = Mode(origin.mode)
    tools = {name: _wrapped(tool, state, by_call, mode, out) for name, tool in job.tools.items()}
    out.job = dataclasses.replace(job, tools=tools)
    return out


def _wrapped(
    tool: Tool, state: RunState, by_call: dict[str, list[Any]], mode: Mode, out: Answering
) -> Tool:
    def fn(ctx: ToolContext) -> Any:
        signature = call_signature(tool.name, dict(ctx.args))
        recorded = by_call.get(signature)
        if recorded:
            # The k-th proposal of this call gets the k-th recorded observation (the last
            # one again past the end): `seen` counts this proposal already.
            k = max(0, state.seen.get(signature, 1) - 1)
            return _answer(recorded[min(k, len(recorded) - 1)])
        said = one_line(f"{tool.name} {msgspec.json.encode(dict(ctx.args)).decode()}", 160)
        if mode is Mode.STOP_ON_DIVERGENCE:
            out.diverged = out.diverged or said
            raise ToolError("not_executed", "the call is not in the recording")
        if tool.mutates:
            return {HELD: True, "detail": "an evaluation holds a write it has no recording of"}
        return tool.fn(ctx)

    if tool.mutates:  # never executed: it charges its tenant nothing, neither cost nor amounts
        return dataclasses.replace(tool, fn=fn, charges={}, cost_bound_microusd=0)
    return dataclasses.replace(tool, fn=fn)
