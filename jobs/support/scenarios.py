"""The support job's eight reference scenarios, A to H, each built to hit one limit, as data.

The same (params, budget) pairs run in process here and through the queue in the worker, and
must give the same outcome, numbers and effects in both.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from turnstile.jobs.budget import Budget
from turnstile.jobs.clock import SimClock
from turnstile.jobs.kernel import Runtime, run
from turnstile.jobs.model import Model
from turnstile.jobs.runs import new_run
from turnstile.jobs.state import RunState
from turnstile.jobs.support.job import support_job
from turnstile.jobs.support.shop import InMemoryShop, ShopBackend
from turnstile.jobs.support.tools import shop_of
from turnstile.jobs.tools import ToolContext
from turnstile.jobs.trace import Trace

TENANT = "demo"
USER = "cu_ana"
GOAL = "refund the damaged item on order ord_1001"


@dataclass(frozen=True)
class Scenario:
    letter: str
    title: str
    params: dict[str, Any] = field(default_factory=dict)
    budget: Budget = field(default_factory=Budget)


SCENARIOS = (
    Scenario("A", "normal run"),
    Scenario("B", "same call repeated", {"model": "same_call"}),
    Scenario("C", "new ids every step", {"model": "new_ids"}),
    Scenario(
        "D",
        "large results",
        {"model": "search_loop"},
        Budget(max_stalls=10, max_tool_calls=20, max_steps=20),
    ),
    Scenario("E", "slow model calls", {"model_latency_s": 6.0}),
    Scenario("F", "step cap too low", {}, Budget(max_steps=3)),
    Scenario("G", "refund needs approval", {"order": "ord_1004", "amount_cents": 8000}),
    Scenario("H", "write times out", {"tool_latency_s": {"issue_refund": 40.0}}),
)
BY_LETTER = {s.letter: s for s in SCENARIOS}


@dataclass
class InProcess:
    state: RunState
    trace: Trace
    shop: InMemoryShop
    runtime: Runtime

    @property
    def effects(self) -> list[list[Any]]:
        return effects_of(self.shop, self.state)


def effects_of(shop: ShopBackend, state: RunState) -> list[list[Any]]:
    """What the run's shop (its tenant's, of the name the run gives) recorded in the world."""
    ctx = ToolContext(state.run_id, state.tenant, state.user_id, state.params, {}, "", 0.0)
    return shop.effects(state.tenant, shop_of(ctx))


def start(
    scenario: Scenario,
    *,
    run_id: str = "t1",
    shop: InMemoryShop | None = None,
    model: Model | None = None,
    budget: Budget | None = None,
) -> InProcess:
    shop = shop or InMemoryShop()
    job = support_job(shop)
    state = new_run(
        run_id=run_id,
        tenant=TENANT,
        user_id=USER,
        job=job,
        goal=GOAL,
        params=scenario.params,
        budget=budget or scenario.budget,
    )
    clock = SimClock()
    trace = Trace(clock)
    runtime = Runtime(job=job, model=model or job.own_model(state.params), clock=clock, trace=trace)
    return InProcess(state, trace, shop, runtime)


def run_scenario(scenario: Scenario, **kwargs: Any) -> InProcess:
    result = start(scenario, **kwargs)
    try:
        run(result.state, result.runtime)
    finally:
        result.runtime.close()
    return result


def row(letter: str, state: RunState, effects: list[list[Any]]) -> dict[str, Any]:
    """One line of the scenario table, in the shape `turnstile scenarios --json` prints."""
    return {
        "scenario": letter,
        "outcome": state.outcome.value if state.outcome else None,
        "detail": state.detail,
        "steps": state.usage.steps,
        "tool_calls": state.usage.tool_calls,
        "tokens": state.usage.tokens,
        "elapsed_s": state.usage.elapsed_ms / 1000,
        "effects": effects,
    }


def table() -> list[dict[str, Any]]:
    out = []
    for scenario in SCENARIOS:
        result = run_scenario(scenario)
        out.append(row(scenario.letter, result.state, result.effects))
    return out
