"""Whatever the model says, no bound breaks: 2,000 seeded random models and a
hypothesis strategy of reply sequences, against steps, tool calls, tokens, deadline and cost,
and the shop's own invariant that no order is refunded more than its total."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from turnstile.jobs.budget import Budget
from turnstile.jobs.model import ModelRequest, ModelResponse, Scripted
from turnstile.jobs.outcomes import Outcome, Status
from turnstile.jobs.support.scenarios import Scenario, run_scenario

TOOLS = ["get_order", "issue_refund", "send_status_email", "search_policy", "delete_order"]
ORDERS = ["ord_1001", "ord_1004", "ord_9999"]


def random_model(seed: int) -> Scripted:
    rng = random.Random(seed)

    def reply(view: Any, i: int) -> Any:
        r = rng.random()
        if r < 0.10:
            return {
                "type": "final",
                "outcome": rng.choice(["completed", "cannot_complete"]),
                "text": "done",
            }
        if r < 0.20:
            return {
                "type": "plan",
                "steps": [
                    {"id": "s1", "tool": rng.choice(["get_order", "nope"]), "depends_on": []}
                ],
            }
        if r < 0.25:
            return rng.choice([None, "text", {"type": "tool"}, {"type": "tools", "calls": "x"}])
        calls = [
            {
                "name": rng.choice(TOOLS),
                "args": {
                    "order_id": rng.choice(ORDERS),
                    "amount_cents": rng.choice([100, 3000, 8000, 99999]),
                },
                "plan_step": rng.choice([None, "s1"]),
            }
            for _ in range(rng.choice([1, 1, 1, 2, 3]))
        ]
        if len(calls) == 1:
            return {"type": "tool", **calls[0]}
        return {"type": "tools", "calls": calls}

    return Scripted(reply, latency_s=rng.choice([0.5, 1.5, 4.0]))


def check_bounds(state: Any, budget: Budget, orders: dict[str, Any]) -> None:
    assert state.outcome is not None
    assert state.status in (Status.STOPPED, Status.SUSPENDED)
    assert state.usage.steps <= budget.max_steps
    assert state.usage.tool_calls <= budget.max_tool_calls
    assert state.usage.tokens <= budget.max_tokens
    assert state.usage.elapsed_ms <= budget.deadline_ms
    assert state.usage.cost_microusd <= budget.max_cost_microusd
    assert all(o.refunded_cents <= o.total_cents for o in orders.values())


# In the serial part: 2,000 kernel runs, about 40 s of one core, which the fast part's four
# processes would share with tests that wait on timers.
@pytest.mark.slow
def test_two_thousand_random_models_break_no_bound() -> None:
    budget = Budget()
    outcomes: Counter[str] = Counter()
    worst = Counter[str]()
    for seed in range(2000):
        result = run_scenario(Scenario("R", "random"), model=random_model(seed), run_id=f"r{seed}")
        state = result.state
        check_bounds(state, budget, result.shop.orders(state.tenant, f"r{seed}"))
        outcomes[f"{state.outcome}/{state.detail}"] += 1
        for name in ("steps", "tool_calls", "tokens", "elapsed_ms"):
            worst[name] = max(worst[name], getattr(state.usage, name))
    assert sum(outcomes.values()) == 2000
    assert len(outcomes) >= 6  # the random replies reach many different ends
    assert worst["steps"] == budget.max_steps
    assert worst["elapsed_ms"] == budget.deadline_ms


json_leaf = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.text(max_size=30))
json_value = st.recursive(
    json_leaf,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
args = st.fixed_dictionaries(
    {},
    optional={
        "order_id": st.one_of(st.sampled_from(ORDERS), json_leaf),
        "amount_cents": st.one_of(st.integers(-5, 20_000), json_leaf),
        "reason": st.text(max_size=20),
        "q": st.text(max_size=20),
    },
)
one_call = st.fixed_dictionaries(
    {"name": st.sampled_from(TOOLS), "args": args},
    optional={"plan_step": st.sampled_from(["s1", "s2", "s3", "zz"])},
)
plan_step = st.fixed_dictionaries(
    {"id": st.sampled_from(["s1", "s2", "s3"]), "tool": st.sampled_from(TOOLS)},
    optional={"depends_on": st.lists(st.sampled_from(["s1", "s2", "s3"]), max_size=2)},
)
reply = st.one_of(
    one_call.map(lambda c: {"type": "tool", **c}),
    st.lists(one_call, min_size=1, max_size=4).map(lambda cs: {"type": "tools", "calls": cs}),
    st.lists(plan_step, max_size=4).map(lambda steps: {"type": "plan", "steps": steps}),
    st.fixed_dictionaries(
        {
            "type": st.just("final"),
            "outcome": st.sampled_from(["completed", "cannot_complete", "escalate", "nah"]),
            "text": st.text(max_size=50),
        }
    ),
    json_value,
)


class Sequence:
    def __init__(self, replies: list[Any], latencies: list[float]) -> None:
        self.replies, self.latencies = replies, latencies

    def next(self, request: ModelRequest) -> ModelResponse:
        i = request.step - 1
        return ModelResponse(
            self.replies[i % len(self.replies)], self.latencies[i % len(self.latencies)]
        )


@settings(max_examples=150, deadline=None)
@given(
    replies=st.lists(reply, min_size=1, max_size=10),
    latencies=st.lists(st.floats(0, 12, allow_nan=False), min_size=1, max_size=5),
    max_steps=st.integers(1, 12),
    max_tool_calls=st.integers(0, 8),
    max_tokens=st.integers(400, 5000),
    max_cost=st.integers(0, 50_000),
)
def test_any_reply_sequence_keeps_every_bound(
    *,
    replies: list[Any],
    latencies: list[float],
    max_steps: int,
    max_tool_calls: int,
    max_tokens: int,
    max_cost: int,
) -> None:
    budget = Budget(
        max_steps=max_steps,
        max_tool_calls=max_tool_calls,
        max_tokens=max_tokens,
        max_cost_microusd=max_cost,
        max_repeat=3,
        max_stalls=4,
    )
    result = run_scenario(
        Scenario("H", "hypothesis"), model=Sequence(replies, latencies), budget=budget
    )
    check_bounds(result.state, budget, result.shop.orders(result.state.tenant, "t1"))
    assert result.state.outcome in set(Outcome)
