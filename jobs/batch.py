"""A turn's calls: the batch the model proposed, vetted whole before anything runs (guardrails,
policy, the budget and the ledger's room), then the reads together and the writes one at a
time, one observation per proposal in proposal order (`calls_turn`); and an approved held
call, run first under its original key (`run_held`)."""

from __future__ import annotations

from typing import Any

from turnstile.jobs.budget import Usage
from turnstile.jobs.calls import Batch, Invoker, Planned, apply, call_digest, fit, signatures, vet
from turnstile.jobs.loops import oscillating, repeated, turn_signature
from turnstile.jobs.moves import Move, finish, out_of_budget
from turnstile.jobs.outcomes import Detector, Outcome, Resource
from turnstile.jobs.replies import Batch as BatchReply
from turnstile.jobs.replies import OneCall, calls_of
from turnstile.jobs.runtime import Runtime, remaining_ms, spend_time
from turnstile.jobs.state import HeldCall, RunState
from turnstile.jobs.tools import ToolContext, error
from turnstile.jobs.trace import ROOT_ID


def _context(
    state: RunState, planned: Planned, rt: Runtime, span_id: str, *, approved: bool = False
) -> ToolContext:
    timeout_s = min(planned.tool.timeout_s, remaining_ms(state) / 1000)
    return ToolContext(
        run_id=state.run_id,
        tenant=state.tenant,
        user_id=state.user_id,
        params=state.params,
        args=planned.call.args,
        key=planned.key,
        timeout_s=timeout_s,
        approved=approved,
        live=rt.live,
        call=span_id,
        tool=planned.call.name,
    )


def _run_reads(state: RunState, rt: Runtime, batch: Batch, reads: list[Planned]) -> None:
    """Reads run together; their observations keep proposal order; the turn is charged the
    longest of them, since their times overlap."""
    if not reads:
        return
    invoker = Invoker(
        rt.trace,
        rt.clock,
        rt.executor,
        batch.step,
        log=rt.log_tool_raises,
        recorded_s=rt.recorded_s,
    )
    t0 = rt.clock.now()
    pending = []
    for planned in reads:
        span_id = f"t{batch.step}.c{planned.index + 1}"
        ctx = _context(state, planned, rt, span_id)
        pending.append((planned, ctx, span_id, invoker.submit(planned, ctx, span_id)))
    finished = [
        (planned, invoker.collect(planned, ctx, span_id, future, rt.clock.now() - t0))
        for planned, ctx, span_id, future in pending
    ]
    spend_time(state, rt.clock, max(d.latency_ms for _, d in finished), rt.clock.now() - t0)
    for planned, done in finished:
        rt.trace.add(done.span)
        apply(state, planned, done, rt.job)
        batch.observations[planned.index] = done.result


def _run_write(
    state: RunState,
    rt: Runtime,
    planned: Planned,
    step: int,
    span_id: str,
    *,
    approved: bool = False,
) -> dict[str, Any]:
    invoker = Invoker(
        rt.trace, rt.clock, rt.executor, step, log=rt.log_tool_raises, recorded_s=rt.recorded_s
    )
    ctx = _context(state, planned, rt, span_id, approved=approved)
    t0 = rt.clock.now()
    done = invoker.collect(planned, ctx, span_id, invoker.submit(planned, ctx, span_id), 0.0)
    spend_time(state, rt.clock, done.latency_ms, rt.clock.now() - t0)
    rt.trace.add(done.span)
    apply(state, planned, done, rt.job)
    return done.result


def _run_writes(state: RunState, rt: Runtime, batch: Batch, writes: list[Planned]) -> None:
    """Writes run one at a time in proposal order. After a write that needs approval or whose
    outcome is unknown, the later writes are not run: they may depend on it."""
    for planned in writes:
        if batch.ended.held is not None or batch.ended.unknown is not None:
            batch.observations[planned.index] = error("not_executed", "an earlier write stopped")
            continue
        result = _run_write(state, rt, planned, batch.step, f"t{batch.step}.c{planned.index + 1}")
        batch.observations[planned.index] = result
        if result["status"] == "needs_approval":
            batch.ended.held = HeldCall(
                call=planned.call,
                key=planned.key,
                digest=call_digest(planned.call),
                reason="the tool asked for approval",
            )
        elif result["status"] == "unknown":
            batch.ended.unknown = planned.call


def _loop_stop(state: RunState, batch_sigs: list[str]) -> Move | None:
    budget = state.budget
    for sig in batch_sigs:
        state.seen[sig] = state.seen.get(sig, 0) + 1
    state.recent = [*state.recent, turn_signature(batch_sigs)][-max(1, budget.oscillation_window) :]
    if repeated(state.seen, max_repeat=budget.max_repeat) is not None:
        reason = f"the same call was proposed more than {budget.max_repeat} times"
        return finish(state, Outcome.LOOP_DETECTED, reason, Detector.REPEATED_CALL)
    if oscillating(state.recent, window=budget.oscillation_window):
        reason = f"the run alternated between two calls for {budget.oscillation_window} turns"
        return finish(state, Outcome.LOOP_DETECTED, reason, Detector.OSCILLATION)
    return None


def calls_turn(state: RunState, rt: Runtime, reply: OneCall | BatchReply, step: int) -> Move | None:
    calls = calls_of(reply)
    stop = _loop_stop(state, signatures(calls))
    if stop is not None:
        return stop
    batch = Batch(calls=calls, step=step)
    vet(state, rt.job, batch)
    if batch.ended.halt is not None:
        return finish(state, Outcome.GUARDRAIL_STOP, batch.ended.halt.detail, "guardrail")
    fit(state, rt.job, batch, rt.gate)
    if batch.ended.exhausted is not None:
        dimension = batch.ended.exhausted
        state.last_result = error("over_budget", f"tenant.{dimension}")
        reason = f"the tenant's {dimension} ceiling has no room for this turn's calls"
        return finish(state, Outcome.BUDGET_EXHAUSTED, reason, f"tenant.{dimension}")
    _run_reads(state, rt, batch, [p for p in batch.approved if not p.tool.mutates])
    _run_writes(state, rt, batch, [p for p in batch.approved if p.tool.mutates])
    observations = [o for o in batch.observations if o is not None]
    assert len(observations) == len(calls), "every proposed call yields one observation"
    state.last_calls = list(calls)
    state.last_result = (
        observations[0]
        if len(calls) == 1
        else [
            {"call": i + 1, "tool": c.name, **o}
            for i, (c, o) in enumerate(zip(calls, observations, strict=True))
        ]
    )
    if batch.ended.unknown is not None:
        state.unconfirmed = batch.ended.unknown.plan_step or batch.ended.unknown.name
        reason = f"{batch.ended.unknown.name} timed out: it may or may not have taken effect"
        return finish(state, Outcome.UNKNOWN_OUTCOME, reason)
    if batch.ended.held is not None:
        state.pending = batch.ended.held
        return finish(
            state,
            Outcome.NEEDS_APPROVAL,
            f"{batch.ended.held.call.name}: {batch.ended.held.reason}",
        )
    return None


def run_held(state: RunState, rt: Runtime) -> Move | None:
    """Run an approved held call first, under its original key, then carry on as any turn."""
    held = state.pending
    assert held is not None
    tool = rt.job.tools.get(held.call.name)
    if tool is None:
        return finish(state, Outcome.ERROR, f"held call names an unknown tool {held.call.name!r}")
    budget, usage = state.budget, state.usage
    if usage.tool_calls + 1 > budget.max_tool_calls:
        return out_of_budget(
            state, Usage(tool_calls=1), Resource.TOOL_CALLS, "no tool call left for the held call"
        )
    if remaining_ms(state) <= 0:
        return out_of_budget(
            state, Usage(tool_calls=1), Resource.DEADLINE, "no time left for the held call"
        )
    step = usage.steps + 1
    span = rt.trace.start(f"r{step}", "resume", "run held call", ROOT_ID)
    state.pending, state.approval = None, None
    with rt.trace.current(span):
        result = _run_write(
            state, rt, Planned(0, held.call, tool, held.key), step, f"r{step}.c1", approved=True
        )
    state.last_result = result
    state.last_calls = [held.call]
    rt.trace.end(span, str(result.get("code") or result["status"]))
    if result["status"] == "needs_approval":
        state.pending = held
        return finish(
            state, Outcome.NEEDS_APPROVAL, f"{held.call.name}: the tool asked for approval again"
        )
    if result["status"] == "unknown":
        state.unconfirmed = held.call.plan_step or held.call.name
        return finish(
            state,
            Outcome.UNKNOWN_OUTCOME,
            f"{held.call.name} timed out: it may or may not have taken effect",
        )
    return None
