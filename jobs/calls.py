"""One turn's tool calls: vet the whole batch, fit it to the budget, then act.

Nothing runs until every proposed call has been vetted, so a halt on the third proposal leaves
no side effect behind. Reads then run concurrently, writes one at a time in proposal order,
and every proposed call yields exactly one observation, in proposal order.
"""

from __future__ import annotations

import contextvars
import hashlib
import json
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgspec
import structlog

from turnstile.jobs.budget import Usage, est_tokens
from turnstile.jobs.clock import Clock
from turnstile.jobs.job import Guard, Job, Permit, Severity, tighten
from turnstile.jobs.loops import call_signature
from turnstile.jobs.state import Call, HeldCall, RunState
from turnstile.jobs.tools import (
    PERMANENT_CODES,
    Tool,
    ToolContext,
    ToolError,
    ToolOutput,
    error,
    normalize_result,
    observe_error,
    observe_value,
    one_line,
)
from turnstile.jobs.trace import Span, Trace, current_span

TIMEOUT_GRACE_S = 0.05  # how much longer than its timeout a thread is waited for

# Logging is the kernel's only output besides its return values: a tool's unexpected exception
# (or a value that is no result) is an observation for the model, and its traceback (or the
# value's type) is for the job's author, here, once.
log = structlog.get_logger("turnstile.tools")


class Gate(Protocol):
    """Asks for more than the per-turn allowance (a larger batch) before it runs."""

    def extend(self, extra: Usage) -> bool: ...


class Unlimited:
    def extend(self, extra: Usage) -> bool:
        return True


def call_digest(call: Call) -> str:
    """What an approval is bound to: exactly this tool with exactly these arguments."""
    canonical = msgspec.json.encode([call.name, call.args], order="sorted")
    return hashlib.sha256(canonical).hexdigest()[:16]


def plan_step_key(run_id: str, plan_step: str) -> str:
    """The idempotency key of a plan step's write."""
    return f"{run_id}:{plan_step}"


def call_key(
    state: RunState, call: Call, *, step: int, index: int, tool: Tool | None = None
) -> str:
    """One key per logical write: a repeated plan step is the same write, not a new one. A tool
    that names its key arguments gets one key per value of those arguments instead."""
    if tool is not None and tool.key_args:
        picked = [call.args.get(name) for name in tool.key_args]
        digest = hashlib.sha256(msgspec.json.encode(picked, order="sorted")).hexdigest()[:16]
        return f"{state.run_id}:{call.name}:{digest}"
    if call.plan_step:
        return plan_step_key(state.run_id, call.plan_step)
    return f"{state.run_id}:{step}.{index}"


@dataclass
class BatchEnd:
    """How a batch ended, beyond its observations: a halt, a held call, an unknown write."""

    halt: Guard | None = None
    held: HeldCall | None = None
    unknown: Call | None = None
    exhausted: str | None = None  # a job dimension the tenant's ledger had no room for


@dataclass
class Planned:
    index: int
    call: Call
    tool: Tool
    key: str


@dataclass
class Batch:
    calls: list[Call]
    step: int
    observations: list[dict[str, Any] | None] = field(default_factory=list)
    approved: list[Planned] = field(default_factory=list)
    ended: BatchEnd = field(default_factory=BatchEnd)

    def __post_init__(self) -> None:
        self.observations = [None] * len(self.calls)


def _plan_step_problem(state: RunState, call: Call) -> dict[str, Any] | None:
    if call.plan_step is None:
        return None
    step = next((s for s in state.plan if s.id == call.plan_step), None)
    if step is None:
        return error("unknown_plan_step", f"no plan step {call.plan_step!r}")
    if step.tool != call.name:
        return error("plan_step_mismatch", f"step {step.id} is for {step.tool}")
    done = {s.id for s in state.plan if s.status == "done"}
    blocked = [d for d in step.depends_on if d not in done]
    if blocked:
        return error("plan_step_blocked", blocked)
    return None


def _vet_one(state: RunState, job: Job, batch: Batch, index: int) -> None:
    call = batch.calls[index]
    tool = job.tools.get(call.name)
    if tool is None:
        batch.observations[index] = error("unknown_tool", call.name[:80])
        return
    problems = tool.argument_problems(call.args)
    if problems:
        batch.observations[index] = error("invalid_arguments", problems)
        return
    problem = _plan_step_problem(state, call)
    if problem is not None:
        batch.observations[index] = problem
        return
    guard = job.guardrail(call, state)
    if guard is not None and guard.severity is Severity.HALT:
        batch.ended.halt = guard
        return
    if guard is not None:
        batch.observations[index] = error("blocked", guard.detail)
        return
    verdict = tighten(job.policy(call, tool, state), tool)
    key = call_key(state, call, step=batch.step, index=index, tool=tool)
    if verdict.decision is Permit.DENY:
        batch.observations[index] = error("denied", verdict.reason)
    elif verdict.decision is Permit.ASK and batch.ended.held is None:
        batch.ended.held = HeldCall(
            call=call, key=key, digest=call_digest(call), reason=verdict.reason
        )
        batch.observations[index] = {"status": "needs_approval", "reason": verdict.reason}
    elif verdict.decision is Permit.ASK:
        batch.observations[index] = error("not_executed", "another call is awaiting approval")
    else:
        batch.approved.append(Planned(index, call, tool, key))


def vet(state: RunState, job: Job, batch: Batch) -> None:
    """Vet every call before any runs. A halting guardrail stops the whole batch."""
    for index in range(len(batch.calls)):
        _vet_one(state, job, batch, index)
        if batch.ended.halt is not None:
            batch.approved.clear()
            return


def fit(state: RunState, job: Job, batch: Batch, gate: Gate) -> None:
    """Keep the approved calls that fit the run's budget, in proposal order, and ask the gate
    for whatever goes beyond the per-turn allowance. The rest are observed, not run."""
    budget, usage = state.budget, state.usage
    kept: list[Planned] = []
    cost = usage.cost_microusd
    for planned in batch.approved:
        if usage.tool_calls + len(kept) + 1 > budget.max_tool_calls:
            batch.observations[planned.index] = error("over_budget", "tool_calls")
        elif cost + planned.tool.cost_bound_microusd > budget.max_cost_microusd:
            batch.observations[planned.index] = error("over_budget", "cost")
        else:
            kept.append(planned)
            cost += planned.tool.cost_bound_microusd
    batch.approved = _extend(batch, kept, budget.turn_tool_calls, gate)


def _extend(batch: Batch, kept: list[Planned], allowance: int, gate: Gate) -> list[Planned]:
    """Ask the gate, in one request, for the calls beyond the per-turn allowance and for the
    bounds of every job-dimension charge (refund_cents, ...) the kept calls may make. Refused
    over a job dimension, the run stops (`exhausted`); over anything else, the calls past the
    allowance and the charging calls are observed, not run."""
    extra = kept[allowance:]
    asked = Usage(
        tool_calls=len(extra),
        cost_microusd=sum(p.tool.cost_bound_microusd for p in extra),
    )
    for planned in kept:
        asked.charge(planned.tool.charge_bounds(planned.call.args))
    if (not extra and not asked.extra) or gate.extend(asked):
        return kept
    rejected = getattr(gate, "rejected", None)
    if asked.extra and (rejected in asked.extra or rejected is None):
        batch.ended.exhausted = rejected or min(asked.extra)
    dropped = [p for p in kept if p in extra or p.tool.charges]
    for planned in dropped:
        batch.observations[planned.index] = error("over_budget", "tenant")
    return [p for p in kept if p not in dropped]


@dataclass
class Done:
    """A finished call: its observation, the latency and cost it is charged, its span."""

    result: dict[str, Any]
    failed: bool
    latency_ms: int
    cost_microusd: int
    span: Span
    charges: dict[str, int] = field(default_factory=dict)  # to the job's ledger dimensions
    plain: bool = False  # the tool returned a plain value: its facts are the value's fields


def _seconds_to_ms(seconds: float) -> int:
    return max(0, round(seconds * 1000))


def _said(output: object) -> str:
    """A tool call's end as a live reader is told it: ok, error, or the status it returned."""
    if isinstance(output, BaseException):
        return "error"
    if isinstance(output, ToolOutput) and isinstance(output.result, Mapping):
        return str(output.result.get("status") or "ok")[:40]
    return "ok"


class Invoker:
    """Runs tool calls on a thread pool, with the caller's context variables carried over.
    `step` is the run's turn, for the log line of a tool that raised (`log`: whether to)."""

    def __init__(
        self,
        trace: Trace,
        clock: Clock,
        pool: ThreadPoolExecutor,
        step: int,
        *,
        log: bool = True,
        recorded_s: Callable[[str], float | None] | None = None,
    ) -> None:
        self.trace, self.clock, self.pool, self.step, self.log = trace, clock, pool, step, log
        self.recorded_s = recorded_s  # a replay's: the time each call took where it ran

    def _in_thread(
        self, planned: Planned, ctx: ToolContext, span_id: str
    ) -> tuple[Span, object, float]:
        span = self.trace.make(
            span_id, "tool", planned.call.name, current_span.get(), args=ctx.args, key=ctx.key
        )
        t0 = self.clock.now()
        ctx.live.tool_started(span_id, planned.call.name)
        try:
            output: object = planned.tool.fn(ctx)
        except Exception as exc:  # a tool that raises is an observation, not a crash
            output = exc
        measured_s = self.clock.now() - t0
        ctx.live.tool_ended(span_id, planned.call.name, _said(output))
        recorded_s = self.recorded_s(span_id) if self.recorded_s is not None else None
        return span, output, measured_s if recorded_s is None else recorded_s

    def submit(
        self, planned: Planned, ctx: ToolContext, span_id: str
    ) -> Future[tuple[Span, object, float]]:
        snapshot = contextvars.copy_context()
        return self.pool.submit(snapshot.run, self._in_thread, planned, ctx, span_id)

    def collect(
        self,
        planned: Planned,
        ctx: ToolContext,
        span_id: str,
        future: Future[tuple[Span, object, float]],
        waited_s: float,
    ) -> Done:
        """The call's observation. A call past its timeout is abandoned on its thread (the
        worker's hard time limit stops one that never returns) and observed as a timeout."""
        try:
            span, output, measured_s = future.result(
                timeout=max(0.0, ctx.timeout_s - waited_s) + TIMEOUT_GRACE_S
            )
        except FutureTimeout:
            parent = current_span.get()
            span = self.trace.make(
                span_id, "tool", planned.call.name, parent, args=ctx.args, key=ctx.key
            )
            output, measured_s = TimeoutError(), ctx.timeout_s + 1.0
        return self._observe(planned, ctx, span, output, measured_s)

    def _log_raised(
        self, planned: Planned, ctx: ToolContext, span: Span, exc: BaseException, said: str
    ) -> None:
        if self.log:
            log.error(
                "tool_raised", run_id=ctx.run_id, turn=self.step, tool=planned.call.name,
                call=span.id, key=ctx.key, error=said, exc_info=exc,
            )  # fmt: skip

    def _log_bad_result(
        self, planned: Planned, ctx: ToolContext, span: Span, output: object, said: object
    ) -> None:
        """A tool that gave back what is not a result (a set, a datetime, an object, too much):
        the model sees `bad_result`, the job's author this line, once, with the value's type."""
        if self.log:
            value = output.result if isinstance(output, ToolOutput) else output
            log.error(
                "tool_bad_result", run_id=ctx.run_id, turn=self.step, tool=planned.call.name,
                call=span.id, key=ctx.key, value_type=type(value).__name__, detail=said,
            )  # fmt: skip

    def _observe(
        self,
        planned: Planned,
        ctx: ToolContext,
        span: Span,
        output: object,
        measured_s: float,
    ) -> Done:
        tool = planned.tool
        charges = tool.charge_bounds(planned.call.args)  # what may have been spent, unless told
        if isinstance(output, ToolOutput) and output.charges is not None:
            charges = {d: max(0, int(output.charges.get(d, 0))) for d in tool.charges}
        latency_s, cost, plain = measured_s, tool.cost_bound_microusd, False
        if isinstance(output, ToolError):
            result, failed = observe_error(output)
        elif isinstance(output, BaseException):
            result = error("tool_raised", one_line(f"{type(output).__name__}: {output}"))
            failed = True
            self._log_raised(planned, ctx, span, output, result["detail"])
        elif isinstance(output, ToolOutput):
            latency_s = measured_s if output.latency_s is None else output.latency_s
            result, failed = normalize_result(output.result)
            if output.cost_microusd is not None:
                cost = output.cost_microusd
        else:
            result, failed = observe_value(output)
            plain = not failed
        if failed and result.get("code") == "bad_result":  # ours, not a code the tool chose
            self._log_bad_result(planned, ctx, span, output, result.get("detail"))
        if latency_s > ctx.timeout_s:
            # A write that outlives its timeout may still have happened: say so, never "failed".
            result = {"status": "unknown", "code": "timeout"} if tool.mutates else error("timeout")
            latency_s, failed, plain = ctx.timeout_s, not tool.mutates, False
        span.t1 = round(span.t0 + latency_s, 6)
        span.status = str(result.get("code") or result["status"])
        if result["status"] == "error" and result.get("detail") is not None:
            detail = result["detail"]  # what the views show beside the code: one bounded line
            span.attrs["detail"] = one_line(detail if isinstance(detail, str) else
                                            msgspec.json.encode(detail).decode())  # fmt: skip
        return Done(
            result, failed, _seconds_to_ms(latency_s), max(0, int(cost)), span, charges, plain
        )


def apply(state: RunState, planned: Planned, done: Done, job: Job) -> None:
    """Fold one call's observation into the state: count it, mark its plan step, copy the
    allow-listed facts, and track the dependency's failures in a row."""
    state.usage.tool_calls += 1
    state.usage.cost_microusd += done.cost_microusd
    state.usage.charge(done.charges)
    result, call = done.result, planned.call
    step = next((s for s in state.plan if s.id == call.plan_step), None)
    if result["status"] == "ok":
        state.failures.pop(call.name, None)
        fields = result.get("result") if done.plain else result
        if isinstance(fields, dict):
            state.facts.update(planned.tool.facts_from(call.args, fields))
        if step is not None:
            step.status = "done"
    elif result["status"] == "error":
        if done.failed:
            state.failures[call.name] = state.failures.get(call.name, 0) + 1
        if step is not None and result.get("code") in PERMANENT_CODES:
            step.status = "failed"
    done.span.attrs["result_tokens"] = est_tokens(json.dumps(result))


def signatures(calls: list[Call]) -> list[str]:
    return [call_signature(c.name, c.args) for c in calls]
