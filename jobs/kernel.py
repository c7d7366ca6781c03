"""One turn of a run, and the loop of turns for running a whole run in one process.

A turn: run an approved held call if there is one; admit the turn against the budget; render
the view; one model call with the remaining time as its timeout; validate the reply; act on
it (its calls: jobs/batch.py); fold the results; check for loops. It returns its next move as
data (jobs/moves.py): continue, finished with an outcome, or suspended for a decision.
Starting and resuming are the same code path. What a turn is given is `Runtime`
(jobs/runtime.py); the names of the three modules a job author meets are importable from here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from turnstile.jobs.batch import calls_turn, run_held
from turnstile.jobs.budget import Usage, est_tokens, first_unfit, model_cost_microusd, turn_exposure
from turnstile.jobs.job import Job
from turnstile.jobs.loops import NO_CALL, stalled
from turnstile.jobs.model import (
    ModelRequest,
    ModelResponse,
    ModelStop,
    ModelTimeout,
    provider_overhead_tokens,
)
from turnstile.jobs.moves import (
    Continue,
    Finished,
    Move,
    Suspended,
    current_move,
    finish,
    out_of_budget,
    status_of,
)
from turnstile.jobs.outcomes import Detector, Outcome, Resource, Status
from turnstile.jobs.plans import accept_plan, open_steps, validate_plan
from turnstile.jobs.replies import Batch as BatchReply
from turnstile.jobs.replies import Final, OneCall, Plan, jsonable, parse_reply, reply_tokens
from turnstile.jobs.runtime import READ_POOL_SIZE, Runtime, ms, remaining_ms, spend_time
from turnstile.jobs.state import RunState
from turnstile.jobs.tools import error
from turnstile.jobs.trace import ROOT_ID, Span

__all__ = [
    "READ_POOL_SIZE",
    "Continue",
    "Finished",
    "Move",
    "Runtime",
    "Suspended",
    "current_move",
    "est_input_tokens",
    "exposure",
    "finish",
    "out_of_budget",
    "run",
    "turn",
]


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
        return calls_turn(state, rt, reply, step)
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
        remaining_ms(state) / 1000,
        step,
        tools=rt.job.tool_specs,
        previous_calls=tuple(state.last_calls),
        last_result=state.last_result,
        live=rt.live,
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
    latency_ms = ms(measured_s if spent.latency_s is None else spent.latency_s)
    latency_ms = min(latency_ms, remaining_ms(state))
    spend_time(state, rt.clock, latency_ms, measured_s)
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
    left_ms = remaining_ms(state)
    span = rt.trace.start(f"t{step}.model", "model", "model.next", f"t{step}")
    t0 = rt.clock.now()
    response: ModelResponse | None = None
    try:
        response = rt.model.next(_request(state, rt, view, step))
    except ModelTimeout:
        rt.live.abandon("the model call timed out")
        latency_ms = left_ms + 1
    except ModelStop as stop:
        rt.live.abandon(stop.reason)
        return _model_stopped(state, rt, span, stop, rt.clock.now() - t0)
    except Exception as exc:  # a provider error is an observation; repeated, a tool_failure
        rt.live.abandon(f"the model call failed: {type(exc).__name__}")
        failed_ms = ms(rt.clock.now() - t0)
        spend_time(state, rt.clock, failed_ms, rt.clock.now() - t0)
        rt.trace.end(
            span, "error", error=f"{type(exc).__name__}: {exc}"[:200], latency_s=failed_ms / 1000
        )
        return _model_failed(state, exc)
    measured_s = rt.clock.now() - t0
    if response is not None:
        latency_ms = ms(measured_s if response.latency_s is None else response.latency_s)
    if latency_ms > left_ms:
        spend_time(state, rt.clock, left_ms, measured_s)
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
    spend_time(state, rt.clock, latency_ms, measured_s)
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
        tokens += provider_overhead_tokens(
            job.tools.values(), state.last_result, definitions=job.definition_tokens
        )
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


def _reserve(state: RunState, job: Job, est_in: int) -> Usage:
    """The next turn's worst case, as admission checks it against the run's budget, for a
    model input estimated at `est_in` tokens."""
    return turn_exposure(
        input_tokens=est_in,
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
        stop = run_held(state, rt)
        if stop is not None:
            return stop
        view = None
    if view is None:
        view = rt.job.view(state)
    est_in = est_input_tokens(state, rt.job, view)  # the view's and the call's, counted once
    reserve = _reserve(state, rt.job, est_in)
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
        replied = _call_model(state, rt, view, est_in, step)
        if isinstance(replied, _Replied):
            stop = _after(state, before, _dispatch(state, rt, replied.raw, replied.oversize, step))
        elif replied is None:
            stop = _after(state, before, None)
        else:
            stop = replied
    move = stop or Continue()
    rt.trace.end(span, status_of(move))
    return move


def run(state: RunState, rt: Runtime) -> Move:
    """Turn after turn until the run finishes or suspends: the in-process form of the worker."""
    root = rt.trace.get(ROOT_ID) or rt.trace.start(ROOT_ID, "task", state.run_id, None)
    move: Move = current_move(state) if state.status is Status.STOPPED else Continue()
    while isinstance(move, Continue):
        move = turn(state, rt)
    rt.trace.end(root, status_of(move))
    return move
