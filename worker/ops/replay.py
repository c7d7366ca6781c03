"""Replay a stored run in this process: does the kernel, given the model replies the run
recorded, reach the state the store holds?

The initial state comes from the run's `submitted` event. Each `turn` event is one kernel turn,
run on a simulated clock with the model replaced by that turn's recorded replies (recovered
from its model spans) and the tools run against a fresh in-memory shop. Decisions are applied
where they were recorded, with who and when; a park and a resume set the status as the worker
did; an ending the worker imposed (a cancel at a boundary, a tenant budget refusal, a poison
step, a turn cut off by its time limit) is applied as recorded. The final state is compared
field by field with the stored one.

What replay cannot reproduce, and reports as a difference: a world the run did not have to
itself (a shop shared by several runs, a write replayed from its idempotency record after a
worker died) and a larger batch the tenant's ledger refused.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import msgspec

from turnstile.errors import TurnstileError
from turnstile.jobs.budget import Usage
from turnstile.jobs.calls import Gate, Unlimited
from turnstile.jobs.clock import SimClock
from turnstile.jobs.conversations import receive
from turnstile.jobs.decisions import approve, cancel, deny
from turnstile.jobs.errors import KernelError, StateFormatError
from turnstile.jobs.job import Job
from turnstile.jobs.kernel import Runtime, finish, turn
from turnstile.jobs.model import Replay, responses_from_spans
from turnstile.jobs.outcomes import Outcome, Status
from turnstile.jobs.recording import answering
from turnstile.jobs.state import FollowUp, RunState
from turnstile.jobs.tools import Tool, ToolContext
from turnstile.jobs.trace import Span, Trace
from turnstile.worker.client._client import Client
from turnstile.worker.ops.decisions import resolve
from turnstile.worker.registry import Registry
from turnstile.worker.store import fields

CUT_OFF = "the turn outlived its time limit"  # the step's reason when its soft limit fired


class ReplayError(TurnstileError):
    """The run cannot be replayed at all (its first events are gone, its job is unknown)."""


@dataclass(frozen=True)
class Difference:
    path: str
    stored: Any
    replayed: Any


@dataclass
class ReplayResult:
    run_id: str
    tenant: str
    matches: bool
    turns: int  # kernel turns replayed
    stored_status: str
    replayed_status: str
    stored_outcome: str | None
    replayed_outcome: str | None
    difference: Difference | None = None
    notes: list[str] = field(default_factory=list)


def first_difference(stored: Any, replayed: Any, path: str = "") -> Difference | None:
    """The first field, in sorted key order and list order, where two JSON values differ."""
    if isinstance(stored, dict) and isinstance(replayed, dict):
        pairs = [
            (f"{path}.{name}" if path else name, stored.get(name, _MISSING),
             replayed.get(name, _MISSING))
            for name in sorted(set(stored) | set(replayed))
        ]  # fmt: skip
    elif isinstance(stored, list) and isinstance(replayed, list) and len(stored) == len(replayed):
        pairs = [(f"{path}[{i}]", a, replayed[i]) for i, a in enumerate(stored)]
    elif isinstance(stored, list) and isinstance(replayed, list):
        shared = min(len(stored), len(replayed))
        found = first_difference(stored[:shared], replayed[:shared], path)
        return found or Difference(f"{path}.length", len(stored), len(replayed))
    else:
        return None if stored == replayed else Difference(path or "state", stored, replayed)
    for where, a, b in pairs:
        if a is _MISSING or b is _MISSING:
            return Difference(where, None if a is _MISSING else a, None if b is _MISSING else b)
        found = first_difference(a, b, where)
        if found is not None:
            return found
    return None


_MISSING = object()


def _without_drills(tool: Tool, drills: tuple[str, ...]) -> Tool:
    """Failure drills act on the worker's process (sleep in a tool, kill the process), not on
    the run's state; replay runs without the params the job names as drills."""

    def fn(ctx: ToolContext) -> Any:  # a plain value or a ToolOutput, passed on as is
        params = {k: v for k, v in ctx.params.items() if k not in drills}
        return tool.fn(dataclasses.replace(ctx, params=params))

    return dataclasses.replace(tool, fn=fn)


def replay_job(registry: Registry, name: str) -> Job:
    """The run's job from the registry, built anew with a world of its own, without drills."""
    try:
        job = registry.fresh(name)
    except KernelError as exc:
        raise ReplayError(str(exc)) from exc
    tools = {n: _without_drills(t, job.drill_params) for n, t in job.tools.items()}
    return dataclasses.replace(job, tools=tools)


@dataclass
class _Replaying:
    state: RunState
    job: Job
    stored: RunState | None  # the stored final state: only for who cancelled at a boundary
    turns: int = 0
    notes: list[str] = field(default_factory=list)
    followups: list[FollowUp] = field(default_factory=list)  # merged, not yet seen by a turn

    def turn(self, event: dict[str, Any], after: dict[str, Any]) -> None:
        seen = int(event.get("followups_seen") or 0)  # as the step took them in (its load)
        receive(self.state, self.followups[:seen])
        del self.followups[:seen]
        recorded = msgspec.convert(event.get("spans") or [], list[Span])
        model = Replay(responses_from_spans(recorded))
        clock = SimClock(self.state.usage.elapsed_ms / 1000)
        took = {s.id: s.duration_s for s in recorded if s.kind == "tool" and s.t1 is not None}
        answered = answering(self.job, self.state)  # an evaluation run's tools, as it had them
        runtime = Runtime(job=answered.job, model=model, clock=clock, trace=Trace(clock),
                          gate=_gate_as_recorded(event, after),
                          log_tool_raises=False, recorded_s=took.get)  # fmt: skip
        self.turns += 1
        try:
            answered.settle(self.state, turn(self.state, runtime))
        except IndexError:
            self.note(f"turn {event.get('step')}: the model was asked more often than recorded")
            return
        finally:
            runtime.close()
        if model.index != len(model.responses):
            self.note(f"turn {event.get('step')}: recorded model replies were left unused")
        totals = msgspec.to_builtins(self.state.usage)
        if event.get("totals") is not None and totals != event["totals"]:
            found = first_difference(event["totals"], totals, "usage")
            assert found is not None
            self.note(
                f"turn {event.get('step')}: {found.path} is {found.replayed!r}, "
                f"recorded {found.stored!r}"
            )

    def cut_off(self, finished: dict[str, Any]) -> None:
        """As the step does when its soft limit fires: the turn's work is discarded and the
        run ends at its deadline with the recorded outcome."""
        state = self.state
        state.usage.elapsed_ms = state.budget.deadline_ms
        if state.pending is not None:
            state.unconfirmed = state.pending.call.plan_step or state.pending.call.name
        finish(state, Outcome(finished["outcome"]), finished.get("reason") or "",
               finished.get("detail"))  # fmt: skip

    def decide(self, event: dict[str, Any]) -> None:
        by, at, kind = str(event.get("by", "")), str(event.get("at", "")), event.get("kind")
        try:
            if kind == "approved":
                approve(self.state, by=by, at=at, digest=event.get("digest"))
            elif kind == "extended":  # a budget hold's extension, with its new limits
                approve(self.state, by=by, at=at, digest=event.get("digest"),
                        extend=event.get("limits") or {})  # fmt: skip
            elif kind == "denied":
                deny(self.state, self.job, by=by, at=at, reason=str(event.get("reason", "")))
            elif kind == "cancelled":
                cancel(self.state, by=by, at=at, reason=str(event.get("reason", "")))
        except KernelError as exc:
            self.note(f"the recorded decision {kind} does not apply: {exc}")

    def ended_by_worker(self, finished: dict[str, Any]) -> None:
        """An ending the step imposed outside the kernel, applied as recorded."""
        outcome = Outcome(finished["outcome"])
        reason = finished.get("reason") or ""
        if outcome is Outcome.CANCELLED:
            index = len(self.state.decisions)
            recorded = self.stored.decisions if self.stored is not None else []
            made = recorded[index] if index < len(recorded) else None
            by = made.by if made is not None else ""
            at = made.at if made is not None else ""
            cancel(self.state, by=by, at=at, reason=reason)
            return
        finish(self.state, outcome, reason, finished.get("detail"))

    def note(self, text: str) -> None:
        if not self.notes:  # the first place replay and record part is the one that matters
            self.notes.append(text)


class _Refused:
    """The tenant's ledger as the turn met it: no room in `rejected`, so the turn's calls that
    charge it end the run as they did (budget_exhausted, tenant.<dimension>)."""

    def __init__(self, rejected: str) -> None:
        self.rejected = rejected

    def extend(self, extra: Usage) -> bool:
        return False


def _gate_as_recorded(turn_event: dict[str, Any], after: dict[str, Any]) -> Gate:
    detail = str(after.get("detail") or "")
    refused = (
        after.get("type") == "finished"
        and turn_event.get("status") == Status.STOPPED.value
        and after.get("outcome") == Outcome.BUDGET_EXHAUSTED.value
        and detail.startswith("tenant.")
    )
    return _Refused(detail.removeprefix("tenant.")) if refused else Unlimited()


def _initial(events: list[dict[str, Any]]) -> RunState:
    if not events or events[0].get("type") != "submitted":
        raise ReplayError("the run's first event is not its submission: it cannot be replayed")
    try:
        return RunState.from_json(msgspec.json.encode(events[0]["state"]))
    except StateFormatError as exc:
        raise ReplayError(f"the submitted state does not load: {exc}") from exc


def replay_events(
    events: list[dict[str, Any]], stored: RunState | None = None, registry: Registry | None = None
) -> tuple[RunState, int, list[str]]:
    """Run the kernel again over a run's recorded events. Returns the replayed state, the
    number of turns replayed and notes on where replay and record parted."""
    state = _initial(events)
    job = replay_job(registry or Registry(None), state.job)
    shared = [k for k in job.shared_params if state.params.get(k)]
    if shared:
        raise ReplayError(
            f"the run shared its world with others ({shared[0]}); replay has a world of one run"
        )
    if job.mcp:  # their tools act on the servers' own worlds: running them again would act twice
        names = ", ".join(server.name for server in job.mcp)
        raise ReplayError(
            f"the run's job calls MCP servers ({names}); replay has a world of one run only"
        )
    rp = _Replaying(state, job, stored)
    for index, event in enumerate(events[1:], start=1):
        kind = event.get("type")
        after = events[index + 1] if index + 1 < len(events) else {}
        if kind == "turn" and str(after.get("reason") or "").startswith(CUT_OFF):
            rp.cut_off(after)
        elif kind == "turn":
            rp.turn(event, after)
        elif kind == "decision":
            rp.decide(event)
        elif kind == "followup":
            rp.followups.append(msgspec.convert(event["followup"], FollowUp))
        elif kind == "parked" and not state.terminal:
            state.status = Status.PARKED
        elif kind == "resumed" and state.status is Status.PARKED:
            state.status = Status.RUNNING
        elif kind == "finished" and not state.terminal:
            rp.ended_by_worker(event)
    return state, rp.turns, rp.notes


def replay_run(c: Client, run_id: str, tenant: str | None = None) -> ReplayResult:
    """Replay the stored run and compare the state it reaches with the stored state."""
    tenant, stored_hash = resolve(c, run_id, tenant)
    stored_json = stored_hash.get(fields.STATE, "")
    try:
        stored: RunState | None = RunState.from_json(stored_json)
    except StateFormatError:
        stored = None
    recorded = [event for _, event in c.store.events(tenant, run_id)]
    replayed, turns, notes = replay_events(recorded, stored, c.jobs)
    theirs = msgspec.json.decode(stored_json) if stored is not None else None
    ours = msgspec.to_builtins(replayed)
    difference = first_difference(theirs, ours)
    return ReplayResult(
        run_id=run_id,
        tenant=tenant,
        matches=difference is None,
        turns=turns,
        stored_status=stored_hash.get(fields.STATUS, ""),
        replayed_status=replayed.status.value,
        stored_outcome=stored.outcome.value if stored is not None and stored.outcome else None,
        replayed_outcome=replayed.outcome.value if replayed.outcome else None,
        difference=difference,
        notes=notes,
    )
