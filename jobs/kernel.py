"""One turn of a run, and the loop of turns for running a whole run in one process.

A turn: run an approved held call if there is one; admit the turn against the budget; render
the view; one model call with the remaining time as its timeout; validate the reply; act on
it; fold the results; check for loops. It returns its next move as data: continue, finished
with an outcome, or suspended for a decision. Starting and resuming are the same code path.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from turnstile.jobs.budget import Usage, est_tokens, first_unfit, model_cost_microusd, turn_exposure
from turnstile.jobs.calls import (
    Batch,
    Gate,
    Invoker,
    Planned,
    Unlimited,
    apply,
    call_digest,
    fit,
    signatures,
    vet,
)
from turnstile.jobs.clock import Clock
from turnstile.jobs.extensions import hold_for
from turnstile.jobs.job import Job
from turnstile.jobs.loops import NO_CALL, oscillating, repeated, stalled, turn_signature
from turnstile.jobs.model import (
    Model,
    ModelRequest,
    ModelResponse,
    ModelStop,
    ModelTimeout,
    ToolSpec,
    provider_overhead_tokens,
)
from turnstile.jobs.outcomes import Detector, Outcome, Resource, Status
from turnstile.jobs.plans import accept_plan, open_steps, validate_plan
from turnstile.jobs.replies import Batch as BatchReply
from turnstile.jobs.replies import (
    Final,
    OneCall,
    Plan,
    calls_of,
    jsonable,
    parse_reply,
    reply_tokens,
)
from turnstile.jobs.state import HeldBudget, HeldCall, RunState
from turnstile.jobs.tools import ToolContext, error
from turnstile.jobs.trace import ROOT_ID, Span, Trace

READ_POOL_SIZE = 8  # concurrent reads in one turn, and so each process's tool-call threads


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


@dataclass
class Runtime:
    """What a turn is given: the kernel owns none of it."""

    job: Job
    model: Model
    clock: Clock
    trace: Trace
    gate: Gate = field(default_factory=Unlimited)
    pool: ThreadPoolExecutor | None = None  # a process can share one across turns
    # Log a tool's unexpected exception with its traceback (once, where the run runs); a
    # replay, which re-runs the tools of a run that ran, says nothing more.
    log_tool_raises: bool = True
    # A replay: how long each tool call took where the run ran (by span id), charged instead
    # of what the replay measures, which a worker's wall clock cannot give twice.
    recorded_s: Callable[[str], float | None] | None = None
    _own_pool: ThreadPoolExecutor | None = field(default=None, init=False, repr=False)

    @property
    def executor(self) -> ThreadPoolExecutor:
        if self.pool is not None:
            return self.pool
        if self._own_pool is None:
            self._own_pool = ThreadPoolExecutor(READ_POOL_SIZE, "turnstile-tool")
        return self._own_pool

    def close(self) -> None:
        """Shut down the pool this runtime made for itself; a shared one is left alone."""
        if self._own_pool is not None:
            self._own_pool.shutdown(wait=False, cancel_futures=True)


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


def _ms(seconds: float) -> int:
    return max(0, round(seconds * 1000))


def _remaining_ms(state: RunState) -> int:
    return max(0, state.budget.deadline_ms - state.usage.elapsed_ms)


def _spend_time(state: RunState, clock: Clock, latency_ms: int, measured_s: float) -> None:
    """Charge active time, and move the clock by whatever was reported but not lived."""
    state.usage.elapsed_ms += latency_ms
    lag = latency_ms / 1000 - measured_s
    if lag > 0:
        clock.advance(lag)


# -- tool calls ---------------------------------------------------------------------------


def _context(state: RunState, planned: Planned, *, approved: bool = False) -> ToolContext:
    timeout_s = min(planned.tool.timeout_s, _remaining_ms(state) / 1000)
    return ToolContext(
        run_id=state.run_id,
        tenant=state.tenant,
        user_id=state.user_id,
        params=state.params,
        args=planned.call.args,
        key=planned.key,
        timeout_s=timeout_s,
        approved=approved,
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
        ctx = _context(state, planned)
        span_id = f"t{batch.step}.c{planned.index + 1}"
        pending.append((planned, ctx, span_id, invoker.submit(planned, ctx, span_id)))
    finished = [
        (planned, invoker.collect(planned, ctx, span_id, future, rt.clock.now() - t0))
        for planned, ctx, span_id, future in pending
    ]
    _spend_time(state, rt.clock, max(d.latency_ms for _, d in finished), rt.clock.now() - t0)
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
    ctx = _context(state, planned, approved=approved)
    t0 = rt.clock.now()
    done = invoker.collect(planned, ctx, span_id, invoker.submit(planned, ctx, span_id), 0.0)
    _spend_time(state, rt.clock, done.latency_ms, rt.clock.now() - t0)
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


def _calls_turn(
    state: RunState, rt: Runtime, reply: OneCall | BatchReply, step: int
) -> Move | None:
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


# -- other replies ------------------------------------------------------------------------


def _final_turn(state: RunState, reply: Final) -> Move | None:
    if reply.outcome == "completed":
        still_open = open_steps(state.plan)
        if still_open:
            state.last_result = error("plan_incomplete", still_open)
            return None
        state.answer = reply.text
        return finish(state, Outcome.COMPLETED, "the model's final answer passed the plan check")
    state.answer = reply.text
    return finish(
        state, Outcome.ESCALATED, f"the model could not complete the task: {reply.text}"[:300]
    )


def _plan_turn(state: RunState, rt: Runtime, reply: Plan) -> None:
    if state.plan:
        problems = ["a plan is already set; one plan per run"]
    else:
        problems = validate_plan(
            reply.steps, tools=rt.job.tools, max_steps=state.budget.max_plan_steps
        )
    if problems:
        state.last_result = error("invalid_plan", problems)
    else:
        state.plan = accept_plan(reply.steps)


def _dispatch(state: RunState, rt: Runtime, raw: Any, oversize: bool, step: int) -> Move | None:
    reply = (
        "larger than the output cap"
        if oversize
        else parse_reply(raw, max_batch=state.budget.max_batch)
    )
    state.last_calls = []  # a calls turn sets them again
    if isinstance(reply, OneCall | BatchReply):
        return _calls_turn(state, rt, reply, step)
    state.recent = [*state.recent, NO_CALL][-max(1, state.budget.oscillation_window) :]
    if isinstance(reply, str):
        state.last_result = error("invalid_reply", reply)
        return None
    if isinstance(reply, Final):
        return _final_turn(state, reply)
    _plan_turn(state, rt, reply)
    return None


# -- the model call -----------------------------------------------------------------------


@dataclass
class _Replied:
    raw: Any
    oversize: bool


def _model_failed(state: RunState, exc: Exception) -> Move | None:
    failures = state.failures.get("model", 0) + 1
    state.failures["model"] = failures
    state.last_calls = []
    state.last_result = error("model_error", f"{type(exc).__name__}: {exc}"[:200])
    if failures >= state.budget.max_tool_failures:
        return finish(
            state, Outcome.TOOL_FAILURE, f"the model failed {failures} times in a row", "model"
        )
    return None


def _request(state: RunState, rt: Runtime, view: str, step: int) -> ModelRequest:
    return ModelRequest(
        view,
        state.budget.max_output_tokens,
        _remaining_ms(state) / 1000,
        step,
        tools=tuple(ToolSpec(t.name, t.description, t.schema) for t in rt.job.tools.values()),
        previous_calls=tuple(state.last_calls),
        last_result=state.last_result,
    )


def _charge(state: RunState, tokens_in: int, tokens_out: int, cost_microusd: int | None) -> None:
    """Count a call's tokens, and its cost: as the provider priced it, else at the budget's
    rates."""
    state.usage.tokens += tokens_in + tokens_out
    state.usage.cost_microusd += (
        model_cost_microusd(input_tokens=tokens_in, output_tokens=tokens_out, budget=state.budget)
        if cost_microusd is None
        else cost_microusd
    )


def _model_stopped(
    state: RunState, rt: Runtime, span: Span, stop: ModelStop, measured_s: float
) -> Move:
    """The provider's answer ended the run: charge what it billed, record why."""
    spent = stop.spent
    latency_ms = _ms(measured_s if spent.latency_s is None else spent.latency_s)
    latency_ms = min(latency_ms, _remaining_ms(state))
    _spend_time(state, rt.clock, latency_ms, measured_s)
    _charge(state, spent.input_tokens or 0, spent.output_tokens or 0, spent.cost_microusd)
    rt.trace.end(
        span, "stop", latency_s=latency_ms / 1000, outcome=stop.outcome.value,
        reason=stop.reason, detail=stop.detail, provider_usage=spent.usage_attrs(),
        **_answered(spent),
    )  # fmt: skip
    state.last_calls = []
    return finish(state, stop.outcome, stop.reason, stop.detail)


def _call_model(
    state: RunState, rt: Runtime, view: str, est_in: int, step: int
) -> _Replied | Move | None:
    """One model call with the remaining time as its timeout. A call that would outlive the
    deadline ends the run at the deadline, its tokens uncounted: the reply never arrived."""
    budget = state.budget
    remaining_ms = _remaining_ms(state)
    span = rt.trace.start(f"t{step}.model", "model", "model.next", f"t{step}")
    t0 = rt.clock.now()
    response: ModelResponse | None = None
    try:
        response = rt.model.next(_request(state, rt, view, step))
    except ModelTimeout:
        latency_ms = remaining_ms + 1
    except ModelStop as stop:
        return _model_stopped(state, rt, span, stop, rt.clock.now() - t0)
    except Exception as exc:  # a provider error is an observation; repeated, a tool_failure
        failed_ms = _ms(rt.clock.now() - t0)
        _spend_time(state, rt.clock, failed_ms, rt.clock.now() - t0)
        rt.trace.end(
            span, "error", error=f"{type(exc).__name__}: {exc}"[:200], latency_s=failed_ms / 1000
        )
        return _model_failed(state, exc)
    measured_s = rt.clock.now() - t0
    if response is not None:
        latency_ms = _ms(measured_s if response.latency_s is None else response.latency_s)
    if latency_ms > remaining_ms:
        _spend_time(state, rt.clock, remaining_ms, measured_s)
        rt.trace.end(span, "deadline", latency_s=latency_ms / 1000, timeout=response is None)
        return finish(
            state,
            Outcome.BUDGET_EXHAUSTED,
            "the model call would outlive the deadline",
            Resource.DEADLINE,
        )
    assert response is not None
    raw = jsonable(response.reply)
    est_out = reply_tokens(raw)
    oversize = response.output_tokens is None and est_out > budget.max_output_tokens
    tokens_in = est_in if response.input_tokens is None else response.input_tokens
    reported_out = response.output_tokens
    tokens_out = budget.max_output_tokens if oversize else reported_out
    if tokens_out is None:
        tokens_out = est_out
    _spend_time(state, rt.clock, latency_ms, measured_s)
    _charge(state, tokens_in, tokens_out, response.cost_microusd)
    rt.trace.end(
        span,
        input_tokens=tokens_in,
        output_tokens=tokens_out,
        reply=raw,
        latency_s=latency_ms / 1000,
        provider_usage=response.usage_attrs(),
        **_answered(response),
    )
    return _Replied(raw, oversize)


def _answered(response: ModelResponse) -> dict[str, Any]:
    """Which model answered the turn, and why a fallback did, when the model says."""
    said = {"model": response.answered_by, "fallback": response.fallback}
    return {k: v for k, v in said.items() if v is not None}


# -- the turn -----------------------------------------------------------------------------


def _run_held(state: RunState, rt: Runtime) -> Move | None:
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
    if _remaining_ms(state) <= 0:
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


def _after(state: RunState, before: str, stop: Move | None) -> Move | None:
    """End-of-turn checks: progress (the state signature), then failing dependencies."""
    state.stalls = 0 if state.signature() != before else state.stalls + 1
    if stop is not None:
        return stop
    if stalled(state.stalls, max_stalls=state.budget.max_stalls):
        reason = f"{state.stalls} turns in a row left the facts and the plan unchanged"
        return finish(state, Outcome.LOOP_DETECTED, reason, Detector.NO_PROGRESS)
    failing = next(
        (n for n, c in state.failures.items() if c >= state.budget.max_tool_failures), None
    )
    if failing is not None:
        return finish(
            state,
            Outcome.TOOL_FAILURE,
            f"{failing} failed {state.failures[failing]} times in a row",
            failing,
        )
    return None


def est_input_tokens(state: RunState, job: Job, view: str) -> int:
    """The model call's input, estimated: the view, and for a provider model what its request
    carries besides (the tool definitions, the previous exchange, the contract's own text)."""
    tokens = est_tokens(view)
    if job.model_spec(state.params) is not None:
        tokens += provider_overhead_tokens(job.tools.values(), state.last_result)
    return tokens


def exposure(state: RunState, job: Job, view: str | None = None) -> tuple[Resource | None, Usage]:
    """The next turn's worst case, as a shared ledger should hold it, and the first dimension
    of the run's own budget it does not fit (None: admitted). A held call that will run first
    is part of it. `view` is `job.view(state)`, when the caller has it already."""
    worst = turn_exposure(
        input_tokens=est_input_tokens(state, job, job.view(state) if view is None else view),
        budget=state.budget,
        tool_cost_bound_microusd=job.tool_cost_bound_microusd,
    )
    if state.pending is not None and state.status is not Status.SUSPENDED:
        held = job.tools.get(state.pending.call.name)
        worst.tool_calls += 1
        worst.cost_microusd += held.cost_bound_microusd if held else 0
        worst.charge(held.charge_bounds(state.pending.call.args) if held else {})
    return first_unfit(consumed=state.usage, reserve=worst, budget=state.budget), worst


def admit(state: RunState, job: Job, view: str) -> Resource | None:
    """The first budget dimension the next turn does not fit, or None when it is admitted."""
    reserve = _reserve(state, job, view)
    return first_unfit(consumed=state.usage, reserve=reserve, budget=state.budget)


def _reserve(state: RunState, job: Job, view: str) -> Usage:
    """The next turn's worst case, as admission checks it against the run's budget."""
    return turn_exposure(
        input_tokens=est_input_tokens(state, job, view),
        budget=state.budget,
        tool_cost_bound_microusd=job.tool_cost_bound_microusd,
    )


def turn(state: RunState, rt: Runtime, *, view: str | None = None) -> Move:
    """Run one turn of the run in place and return its next move.

    `view` is `rt.job.view(state)` when the caller has rendered it already (the worker does,
    to size the turn's ledger hold), so a turn renders its view once. A held call that runs
    first changes the state, so the view is then rendered again.
    """
    if state.status in (Status.STOPPED, Status.SUSPENDED):
        return current_move(state)
    state.status = Status.RUNNING
    if state.pending is not None:
        stop = _run_held(state, rt)
        if stop is not None:
            return stop
        view = None
    if view is None:
        view = rt.job.view(state)
    reserve = _reserve(state, rt.job, view)
    unfit = first_unfit(consumed=state.usage, reserve=reserve, budget=state.budget)
    if unfit is not None:
        return out_of_budget(
            state, reserve, unfit, f"the next turn does not fit the {unfit} budget"
        )
    state.usage.steps += 1
    step = state.usage.steps
    before = state.signature()
    span = rt.trace.start(f"t{step}", "turn", f"turn {step}", ROOT_ID)
    with rt.trace.current(span):
        replied = _call_model(state, rt, view, est_input_tokens(state, rt.job, view), step)
        if isinstance(replied, _Replied):
            stop = _after(state, before, _dispatch(state, rt, replied.raw, replied.oversize, step))
        elif replied is None:
            stop = _after(state, before, None)
        else:
            stop = replied
    move = stop or Continue()
    rt.trace.end(span, _status_of(move))
    return move


def _status_of(move: Move) -> str:
    if isinstance(move, Finished):
        return move.detail or move.outcome.value
    if isinstance(move, Suspended):
        budget = isinstance(move.held, HeldBudget)
        return (Outcome.NEEDS_BUDGET if budget else Outcome.NEEDS_APPROVAL).value
    return "ok"


def run(state: RunState, rt: Runtime) -> Move:
    """Turn after turn until the run finishes or suspends: the in-process form of the worker."""
    root = rt.trace.get(ROOT_ID) or rt.trace.start(ROOT_ID, "task", state.run_id, None)
    move: Move = current_move(state) if state.status is Status.STOPPED else Continue()
    while isinstance(move, Continue):
        move = turn(state, rt)
    rt.trace.end(root, _status_of(move))
    return move
