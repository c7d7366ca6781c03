"""Budgets and admission arithmetic: pure functions, integers only.

A turn is admitted only if what the run has consumed plus the worst case of the next turn fits
every ceiling. Checking consumption alone answers the weaker question "are we over yet?", which
lets the next turn overshoot.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import msgspec

from turnstile.jobs.outcomes import Resource

MICRO_PER_MILLION = 1_000_000


class Budget(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Ceilings of one run. The defaults suit a three-tool support task (the demo's)."""

    max_steps: int = 8  # model calls
    max_tool_calls: int = 6
    max_tokens: int = 4000  # model input + output, whole run
    max_output_tokens: int = 300  # cap on one model reply
    deadline_ms: int = 30_000  # active time: model and tool latency, not waiting for a person
    max_cost_microusd: int = 1_000_000  # $1, an illustrative cap
    # $3 and $15 per million input and output tokens: illustrative model rates.
    input_microusd_per_mtok: int = 3_000_000
    output_microusd_per_mtok: int = 15_000_000
    turn_tool_calls: int = 1  # tool calls reserved with each model call, before any is proposed
    max_repeat: int = 2  # times one canonical call may be proposed
    max_stalls: int = 3  # consecutive turns that leave the state signature unchanged
    oscillation_window: int = 4  # turns alternating between two calls (A B A B) that stop a run
    max_plan_steps: int = 6
    max_tool_failures: int = 3  # consecutive failures of one dependency before tool_failure
    max_batch: int = 8  # calls one reply may propose

    def validate(self) -> list[str]:
        """Problems with these numbers, in words; empty when the budget is usable."""
        problems = [
            f"{name} must be a non-negative integer"
            for name in self.__struct_fields__
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 0
        ]
        if self.max_output_tokens < 1:
            problems.append("max_output_tokens must be at least 1")
        if self.max_batch < 1:
            problems.append("max_batch must be at least 1")
        return problems


LEDGER_FIELDS = ("steps", "tool_calls", "tokens", "cost_microusd")  # the built-in dimensions


class Usage(msgspec.Struct, kw_only=True):
    """Consumption, or an exposure to reserve: one integer per budget dimension, and one per
    dimension a job declared for its tools to charge (`extra`, e.g. refund_cents)."""

    steps: int = 0
    tool_calls: int = 0
    tokens: int = 0
    elapsed_ms: int = 0
    cost_microusd: int = 0
    extra: dict[str, int] = msgspec.field(default_factory=dict)

    def __add__(self, other: Usage) -> Usage:
        return self._combine(other, 1)

    def __sub__(self, other: Usage) -> Usage:
        return self._combine(other, -1)

    def _combine(self, other: Usage, sign: int) -> Usage:
        extra: dict[str, int] = {}
        if self.extra or other.extra:
            names = sorted(set(self.extra) | set(other.extra))
            sums = {n: self.extra.get(n, 0) + sign * other.extra.get(n, 0) for n in names}
            extra = {n: v for n, v in sums.items() if v}
        return Usage(
            steps=self.steps + sign * other.steps,
            tool_calls=self.tool_calls + sign * other.tool_calls,
            tokens=self.tokens + sign * other.tokens,
            elapsed_ms=self.elapsed_ms + sign * other.elapsed_ms,
            cost_microusd=self.cost_microusd + sign * other.cost_microusd,
            extra=extra,
        )

    def charge(self, amounts: Mapping[str, int]) -> None:
        """Add to the job dimensions. A new dict, never an update in place: a shallow copy of
        a usage (the step's `before`) must not move with it."""
        extra = dict(self.extra)
        for name, amount in amounts.items():
            if amount:
                extra[name] = extra.get(name, 0) + amount
        self.extra = extra

    def ledger_amounts(self) -> dict[str, int]:
        """The amounts a tenant's ledger reserves or settles: the built-in four and the
        job's own dimensions."""
        built_in = {"steps": self.steps, "tool_calls": self.tool_calls, "tokens": self.tokens,
                    "cost_microusd": self.cost_microusd}  # fmt: skip
        return {**built_in, **self.extra} if self.extra else built_in

    @classmethod
    def from_ledger_amounts(cls, amounts: Mapping[str, int]) -> Usage:
        get = amounts.get
        extra = {k: v for k, v in amounts.items() if v and k not in LEDGER_FIELDS}
        return cls(steps=get("steps", 0), tool_calls=get("tool_calls", 0),
                   tokens=get("tokens", 0), cost_microusd=get("cost_microusd", 0),
                   extra=extra)  # fmt: skip


def est_tokens(text: str) -> int:
    """A rough estimate, four characters a token, for when no provider usage is given."""
    return (len(text) + 3) // 4


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def model_cost_microusd(*, input_tokens: int, output_tokens: int, budget: Budget) -> int:
    """Cost of one model call at the budget's rates, rounded up to a whole micro-dollar."""
    return ceil_div(
        input_tokens * budget.input_microusd_per_mtok
        + output_tokens * budget.output_microusd_per_mtok,
        MICRO_PER_MILLION,
    )


def turn_exposure(*, input_tokens: int, budget: Budget, tool_cost_bound_microusd: int) -> Usage:
    """Worst case of the next turn before any call is proposed: one model call with its full
    output cap, plus the per-turn tool allowance at the most expensive tool's bound."""
    return Usage(
        steps=1,
        tool_calls=budget.turn_tool_calls,
        tokens=input_tokens + budget.max_output_tokens,
        cost_microusd=model_cost_microusd(
            input_tokens=input_tokens, output_tokens=budget.max_output_tokens, budget=budget
        )
        + budget.turn_tool_calls * tool_cost_bound_microusd,
    )


# (dimension, the Usage field it counts, the Budget field that caps it), in checking order.
DIMENSIONS = (
    (Resource.STEPS, "steps", "max_steps"),
    (Resource.TOOL_CALLS, "tool_calls", "max_tool_calls"),
    (Resource.DEADLINE, "elapsed_ms", "deadline_ms"),
    (Resource.TOKENS, "tokens", "max_tokens"),
    (Resource.COST, "cost_microusd", "max_cost_microusd"),
)


def admission_rows(
    *, consumed: Usage, reserve: Usage, budget: Budget
) -> Iterator[tuple[Resource, int, int, int, bool]]:
    """(resource, consumed, reserved, ceiling, fits) for each dimension, in checking order.

    Time fits only while some of it is left: a turn always takes time, even with nothing
    reserved for it, so a run at its deadline is not admitted.
    """
    for resource, used, cap in DIMENSIONS:
        spent, held, ceiling = getattr(consumed, used), getattr(reserve, used), getattr(budget, cap)
        fits = spent + held <= ceiling
        if resource is Resource.DEADLINE:
            fits = fits and spent < ceiling
        yield resource, spent, held, ceiling, fits


def first_unfit(*, consumed: Usage, reserve: Usage, budget: Budget) -> Resource | None:
    """The first dimension in which consumed + reserve would pass its ceiling, or None: the
    rows of `admission_rows`, written out (every turn asks, twice or more)."""
    if consumed.steps + reserve.steps > budget.max_steps:
        return Resource.STEPS
    if consumed.tool_calls + reserve.tool_calls > budget.max_tool_calls:
        return Resource.TOOL_CALLS
    elapsed, deadline = consumed.elapsed_ms, budget.deadline_ms
    if elapsed + reserve.elapsed_ms > deadline or not elapsed < deadline:
        return Resource.DEADLINE
    if consumed.tokens + reserve.tokens > budget.max_tokens:
        return Resource.TOKENS
    if consumed.cost_microusd + reserve.cost_microusd > budget.max_cost_microusd:
        return Resource.COST
    return None
