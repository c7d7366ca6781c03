"""A small toolbox for kernel tests: a generic job with read and write tools, and a scripted
model that replies from a list, one reply per turn."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from turnstile.jobs.budget import Budget
from turnstile.jobs.clock import Clock, SimClock
from turnstile.jobs.job import Job, PolicyFn, allow_all
from turnstile.jobs.kernel import Move, Runtime, run
from turnstile.jobs.model import Model, ModelRequest, ModelResponse
from turnstile.jobs.runs import new_run
from turnstile.jobs.state import RunState
from turnstile.jobs.tools import Tool, ToolContext, ToolOutput
from turnstile.jobs.trace import Trace

ID_SCHEMA = {
    "type": "object",
    "properties": {"id": {"type": "string"}, "value": {"type": "integer"}},
    "required": ["id"],
    "additionalProperties": False,
}


@dataclass
class World:
    """What the toy tools touch: a log of calls in the order they ran, and writes by key."""

    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    writes: dict[str, dict[str, Any]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def log(self, name: str, ctx: ToolContext) -> None:
        with self.lock:
            self.calls.append((name, dict(ctx.args)))


def read_tool(
    world: World,
    name: str = "lookup",
    *,
    latency_s: float = 0.5,
    result: Callable[[ToolContext], Any] | None = None,
    sleep_s: float = 0.0,
    timeout_s: float = 30.0,
    cost: int = 0,
) -> Tool:
    def fn(ctx: ToolContext) -> ToolOutput:
        if sleep_s:
            time.sleep(sleep_s)
        world.log(name, ctx)
        out = result(ctx) if result else {"status": "ok", "value": f"{name}:{ctx.args['id']}"}
        return ToolOutput(out, None if sleep_s else latency_s)

    return Tool(
        name=name,
        fn=fn,
        schema=ID_SCHEMA,
        facts=("value",),
        fact_scope="id",
        timeout_s=timeout_s,
        cost_bound_microusd=cost,
    )


def write_tool(
    world: World, name: str = "update", *, latency_s: float = 1.0, reversible: bool = True
) -> Tool:
    def fn(ctx: ToolContext) -> ToolOutput:
        world.log(name, ctx)
        with world.lock:
            if ctx.key in world.writes:
                return ToolOutput({**world.writes[ctx.key], "replayed": True}, 0.1)
            world.writes[ctx.key] = {"status": "ok", "written": ctx.args.get("value", 0)}
        return ToolOutput(world.writes[ctx.key], latency_s)

    return Tool(
        name=name,
        fn=fn,
        schema=ID_SCHEMA,
        mutates=True,
        reversible=reversible,
        facts=("written",),
        fact_scope="id",
        done_text=f"{name} was done",
        open_text=f"{name} was not done",
    )


def make_job(tools: Sequence[Tool], *, policy: PolicyFn = allow_all, **kw: Any) -> Job:
    return Job(
        name="toy",
        tools={t.name: t for t in tools},
        model=lambda p: Listed([]),
        policy=policy,
        **kw,
    )


FINAL = {"type": "final", "outcome": "completed", "text": "done"}


class Listed:
    """Replies from a list, one per turn; after the list, a final answer."""

    def __init__(self, replies: Sequence[Any], latency_s: float = 1.0) -> None:
        self.replies, self.latency_s = list(replies), latency_s
        self.requests: list[ModelRequest] = []

    def next(self, request: ModelRequest) -> ModelResponse:
        self.requests.append(request)
        i = len(self.requests) - 1
        reply = self.replies[i] if i < len(self.replies) else FINAL
        return ModelResponse(reply, self.latency_s)


def call(name: str, id_: str = "x", plan_step: str | None = None, **args: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "tool", "name": name, "args": {"id": id_, **args}}
    if plan_step:
        out["plan_step"] = plan_step
    return out


def batch(*calls: dict[str, Any]) -> dict[str, Any]:
    return {"type": "tools", "calls": [{k: v for k, v in c.items() if k != "type"} for c in calls]}


@dataclass
class Ran:
    state: RunState
    trace: Trace
    move: Move
    runtime: Runtime


def go(
    job: Job,
    model: Model,
    budget: Budget | None = None,
    *,
    clock: Clock | None = None,
    params: Mapping[str, Any] | None = None,
    state: RunState | None = None,
) -> Ran:
    clock = clock or SimClock()
    trace = Trace(clock)
    state = state or new_run(
        run_id="r1",
        tenant="t",
        user_id="u",
        job=job,
        goal="do the thing",
        params=params,
        budget=budget or Budget(),
    )
    runtime = Runtime(job=job, model=model, clock=clock, trace=trace)
    try:
        move = run(state, runtime)
    finally:
        runtime.close()
    return Ran(state, trace, move, runtime)
