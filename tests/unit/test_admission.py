"""Admission arithmetic: consumed plus the next turn's worst case must
fit every ceiling, and the first dimension that does not fit is named."""

from __future__ import annotations

import dataclasses
import json

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.kit import Listed, World, call, go, make_job, read_tool
from turnstile.jobs.budget import (
    Budget,
    Usage,
    admission_rows,
    est_tokens,
    first_unfit,
    model_cost_microusd,
    turn_exposure,
)
from turnstile.jobs.job import Job
from turnstile.jobs.kernel import est_input_tokens
from turnstile.jobs.outcomes import Outcome, Resource
from turnstile.jobs.runs import new_run

SPEC_BUDGET = Budget(
    max_steps=12, max_cost_microusd=1_000_000, deadline_ms=300_000, max_tool_calls=50
)


def test_next_step_exposure_matches_spec() -> None:
    """60,000 input tokens at $3/M, 4,096 output at $15/M and $0.04 of tools: $0.28144."""
    assert model_cost_microusd(input_tokens=60_000, output_tokens=0, budget=SPEC_BUDGET) == 180_000
    assert model_cost_microusd(input_tokens=0, output_tokens=4_096, budget=SPEC_BUDGET) == 61_440
    budget = Budget(max_output_tokens=4_096, turn_tool_calls=6)
    exposure = turn_exposure(
        input_tokens=60_000, budget=budget, tool_cost_bound_microusd=40_000 // 6 + 1
    )
    assert exposure.cost_microusd == 180_000 + 61_440 + 6 * (40_000 // 6 + 1)
    assert 180_000 + 61_440 + 40_000 == 281_440


def test_admission_table_matches_spec() -> None:
    """Turns 11+1 of 12 fit; $0.82+$0.28144 of $1, 287 s+36 s of 300 s and 47+6 of 50 calls
    do not; the first dimension that does not fit is named."""
    consumed = Usage(steps=11, cost_microusd=820_000, elapsed_ms=287_000, tool_calls=47)
    reserve = Usage(steps=1, cost_microusd=281_440, elapsed_ms=36_000, tool_calls=6)
    rows = {
        r[0]: r[1:] for r in admission_rows(consumed=consumed, reserve=reserve, budget=SPEC_BUDGET)
    }
    assert rows[Resource.STEPS] == (11, 1, 12, True)
    assert rows[Resource.COST] == (820_000, 281_440, 1_000_000, False)
    assert rows[Resource.DEADLINE] == (287_000, 36_000, 300_000, False)
    assert rows[Resource.TOOL_CALLS] == (47, 6, 50, False)
    assert (
        first_unfit(consumed=consumed, reserve=reserve, budget=SPEC_BUDGET) is Resource.TOOL_CALLS
    )
    assert 820_000 + 281_440 == 1_101_440  # the projected run cost: over the one-dollar cap


def test_a_run_at_its_deadline_is_not_admitted() -> None:
    consumed = Usage(elapsed_ms=30_000)
    assert first_unfit(consumed=consumed, reserve=Usage(), budget=Budget()) is Resource.DEADLINE
    assert first_unfit(consumed=Usage(elapsed_ms=29_999), reserve=Usage(), budget=Budget()) is None


def test_cost_ceiling_refuses_the_turn_before_the_model_call() -> None:
    """A cost cap that the next turn's worst case would pass stops the run before it pays."""
    world = World()
    model = Listed([call("lookup", f"i{i}") for i in range(500)])
    budget = Budget(
        max_cost_microusd=20_000,
        max_stalls=1000,
        max_steps=500,
        max_tool_calls=500,
        max_tokens=100_000,
        deadline_ms=1_000_000,
    )
    ran = go(make_job([read_tool(world)]), model, budget)
    assert (ran.state.outcome, ran.state.detail) == (Outcome.BUDGET_EXHAUSTED, "cost")
    assert ran.state.usage.cost_microusd <= 20_000
    worst = model_cost_microusd(input_tokens=100, output_tokens=300, budget=budget)
    assert ran.state.usage.cost_microusd + worst > 20_000 - 2_000  # it stopped near, not far below


def test_token_ceiling_counts_next_input_and_output_cap() -> None:
    """The token total never passes max_tokens: the check adds the next input and the cap."""
    ran = go(
        make_job([read_tool(World())]),
        Listed([call("lookup", f"i{i}") for i in range(50)]),
        Budget(max_tokens=900, max_stalls=100, max_steps=50, max_tool_calls=50),
    )
    assert (ran.state.outcome, ran.state.detail) == (Outcome.BUDGET_EXHAUSTED, "tokens")
    assert ran.state.usage.tokens <= 900


_counts = st.integers(min_value=0, max_value=40)
_usages = st.builds(
    Usage, steps=_counts, tool_calls=_counts, tokens=_counts, elapsed_ms=_counts,
    cost_microusd=_counts,
    extra=st.dictionaries(st.sampled_from(["refund_cents", "emails"]), _counts, max_size=2),
)  # fmt: skip
_budgets = st.builds(
    Budget, max_steps=_counts, max_tool_calls=_counts, max_tokens=_counts, deadline_ms=_counts,
    max_cost_microusd=_counts,
)  # fmt: skip


@settings(max_examples=400, deadline=None)
@given(consumed=_usages, reserve=_usages, budget=_budgets)
def test_first_unfit_is_the_first_row_that_does_not_fit(
    consumed: Usage, reserve: Usage, budget: Budget
) -> None:
    """`first_unfit`, written out for speed, says what the table of `admission_rows` says; and
    a usage's sum, difference and ledger amounts are the field-by-field ones."""
    rows = admission_rows(consumed=consumed, reserve=reserve, budget=budget)
    expected = next((r[0] for r in rows if not r[4]), None)
    assert first_unfit(consumed=consumed, reserve=reserve, budget=budget) is expected
    fields = ("steps", "tool_calls", "tokens", "elapsed_ms", "cost_microusd")
    for sign, combined in ((1, consumed + reserve), (-1, consumed - reserve)):
        for name in fields:
            assert getattr(combined, name) == getattr(consumed, name) + sign * getattr(
                reserve, name
            )
        names = set(consumed.extra) | set(reserve.extra)
        sums = {n: consumed.extra.get(n, 0) + sign * reserve.extra.get(n, 0) for n in names}
        assert combined.extra == {n: v for n, v in sums.items() if v}
    assert consumed.ledger_amounts() == {
        "steps": consumed.steps, "tool_calls": consumed.tool_calls, "tokens": consumed.tokens,
        "cost_microusd": consumed.cost_microusd, **consumed.extra,
    }  # fmt: skip
    amounts = consumed.ledger_amounts()
    amounts["steps"] += 1  # a caller's copy: the usage does not move with it
    assert consumed.steps == amounts["steps"] - 1


def test_a_provider_models_input_counts_its_tools_as_it_did_each_turn() -> None:
    """The tool definitions a provider request carries are counted once per job: the estimate
    is the one counted afresh, and a job made with other tools counts its own."""
    world = World()
    small = Job(name="p", tools={"lookup": read_tool(world)}, model="openai:gpt-4.1-mini")
    large = dataclasses.replace(
        small, tools={"lookup": read_tool(world), "other": read_tool(world, "other")}
    )
    for job in (small, large, small):
        state = new_run(run_id="r", tenant="t", user_id="u", job=job, goal="g")
        state.last_result = {"status": "ok", "result": {"x": 1}}
        view = job.view(state)
        fresh = json.dumps(
            [[t.name, t.description, t.schema] for t in job.tools.values()],
            sort_keys=True,
            default=str,
        )
        assert est_input_tokens(state, job, view) == (
            est_tokens(view) + est_tokens(fresh) + est_tokens(json.dumps(state.last_result)) + 600
        )
    assert large.definition_tokens > small.definition_tokens
    assert [s.name for s in large.tool_specs] == ["lookup", "other"]
