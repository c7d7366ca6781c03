"""Input checks and dimension order: pure functions, no server."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from turnstile.ledger import DEFAULT_DIMENSIONS, MAX_AMOUNT, Ledger, LedgerInputError, Period
from turnstile.ledger.inputs import (
    check_amounts,
    check_period,
    check_tenant,
    dimension_rank,
    in_dimension_order,
    seconds_to_ms,
)


def test_dimension_order_is_the_built_ins_then_the_rest_alphabetically() -> None:
    """Rejections are reported steps, tool_calls, tokens, cost_microusd, then a-z."""
    names = ["wall_ms", "cost_microusd", "a_extra", "tokens", "steps", "tool_calls"]
    assert in_dimension_order(names) == [
        "steps",
        "tool_calls",
        "tokens",
        "cost_microusd",
        "a_extra",
        "wall_ms",
    ]


@given(st.lists(st.from_regex(r"[a-z][a-z0-9_]{0,10}", fullmatch=True), unique=True))
def test_dimension_order_is_total_and_stable(names: list[str]) -> None:
    """Any set of names sorts the same way whatever order it came in."""
    ordered = in_dimension_order(names)
    assert in_dimension_order(reversed(names)) == ordered
    assert [dimension_rank(n) for n in ordered] == sorted(dimension_rank(n) for n in names)


def test_amounts_come_back_as_pairs_in_dimension_order() -> None:
    """Valid amounts become (dimension, amount) pairs in the reporting order."""
    pairs = check_amounts(
        {"cost_microusd": 5, "steps": 1, "tokens": MAX_AMOUNT},
        DEFAULT_DIMENSIONS,
        allow_empty=False,
    )
    assert pairs == [("steps", 1), ("tokens", MAX_AMOUNT), ("cost_microusd", 5)]


def test_extra_dimensions_are_accepted_once_declared() -> None:
    """The dimension set is open: a ledger declared with more accepts them."""
    pairs = check_amounts({"wall_ms": 3}, (*DEFAULT_DIMENSIONS, "wall_ms"), allow_empty=False)
    assert pairs == [("wall_ms", 3)]
    with pytest.raises(LedgerInputError, match="unknown dimension"):
        check_amounts({"wall_ms": 3}, DEFAULT_DIMENSIONS, allow_empty=False)


@pytest.mark.parametrize(
    ("seconds", "ms"), [(0, 0), (0.001, 1), (0.0011, 2), (1.1, 1100), (2, 2000), (0.25, 250)]
)
def test_timeouts_become_whole_milliseconds_rounded_up(seconds: float, ms: int) -> None:
    """A fractional timeout never shortens the deadline, and float noise does not lengthen it."""
    assert seconds_to_ms("timeout_s", seconds) == ms


@pytest.mark.parametrize("seconds", [-1, float("nan"), float("inf"), True, "5", None])
def test_bad_timeouts_are_refused(seconds: object) -> None:
    """Negative, infinite or non-numeric timeouts are input errors."""
    with pytest.raises(LedgerInputError):
        seconds_to_ms("timeout_s", seconds)


@pytest.mark.parametrize("tenant", ["", "a{b}", "a b", "x" * 129, "tab\there", 7])
def test_bad_tenants_are_refused(tenant: object) -> None:
    """A tenant must be non-empty and unable to break the hash tag."""
    with pytest.raises(LedgerInputError):
        check_tenant(tenant)


def test_periods_are_a_closed_set() -> None:
    """Only none, day and month are periods."""
    assert check_period("day") is Period.DAY
    with pytest.raises(LedgerInputError):
        check_period("week")


def unreachable_ledger() -> Ledger:
    # Registering scripts does no I/O; nothing listens on port 1, so any I/O would fail as
    # "unavailable", never as an input error.
    return Ledger.from_url("redis://127.0.0.1:1/0")


@pytest.mark.parametrize(
    "call",
    [
        lambda lg: lg.reserve("t", "r", {"tokens": -1}, timeout_s=1),
        lambda lg: lg.reserve("t", "r", {"tokens": 1}, timeout_s=-1),
        lambda lg: lg.reserve("", "r", {"tokens": 1}, timeout_s=1),
        lambda lg: lg.settle("t", "", {"tokens": 1}),
        lambda lg: lg.settle("t", "r", {"nope": 1}),
        lambda lg: lg.release("t", ""),
        lambda lg: lg.set_ceiling("t", "tokens", 2**53 + 1),
        lambda lg: lg.set_ceiling("t", "tokens", 5, period="week"),
        lambda lg: lg.set_ceiling("t", "tokens", 5, hard=1),
        lambda lg: lg.read("{t}"),
    ],
)
def test_bad_input_raises_before_any_io(call: object) -> None:
    """Every operation checks its input before it sends anything."""
    assert callable(call)
    with pytest.raises(LedgerInputError):
        call(unreachable_ledger())


def test_settle_script_args_follow_the_library_contract() -> None:
    """KEYS are the tenant's six keys; ARGV is id, journal length, then pairs in order."""
    ledger = Ledger.from_url("redis://127.0.0.1:1/0", journal_maxlen=500)
    keys, argv = ledger.settle_script_args("acme", "run-1:4", {"tokens": 9, "steps": 1})
    assert [k.rsplit(":", 1)[1] for k in keys] == [
        "limits",
        "usage",
        "records",
        "deadlines",
        "resolved",
        "journal",
    ]
    assert all("{acme}" in k for k in keys)
    assert argv == ["run-1:4", "500", "steps", "1", "tokens", "9"]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (-1, "tokens must be in 0..2^53, got -1"),
        (2**53 + 1, f"tokens must be in 0..2^53, got {2**53 + 1}"),
        (True, "tokens must be an integer, got True"),
        (1.0, "tokens must be an integer, got 1.0"),
        ("1", "tokens must be an integer, got '1'"),
        (None, "tokens must be an integer, got None"),
    ],
)
def test_a_bad_amount_is_refused_with_its_reason(value: object, message: str) -> None:
    """The amounts' plain check lets only whole numbers in range through; anything else is
    told as before, naming the dimension."""
    with pytest.raises(LedgerInputError) as raised:
        check_amounts({"steps": 1, "tokens": value}, DEFAULT_DIMENSIONS, allow_empty=False)
    assert str(raised.value) == message


def test_the_order_of_amounts_does_not_depend_on_the_order_given() -> None:
    """The order is cached per set of names as given: each order given sorts the same."""
    first = check_amounts({"tokens": 2, "steps": 1}, DEFAULT_DIMENSIONS, allow_empty=True)
    again = check_amounts({"steps": 1, "tokens": 2}, DEFAULT_DIMENSIONS, allow_empty=True)
    other = check_amounts(
        {"wall_ms": 3, "tokens": 2}, (*DEFAULT_DIMENSIONS, "wall_ms"), allow_empty=True
    )
    assert first == again == [("steps", 1), ("tokens", 2)]
    assert other == [("tokens", 2), ("wall_ms", 3)]
