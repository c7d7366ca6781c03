"""The client's fast paths give exactly what the full checks and reply parsing give.

Ledger.reserve and Ledger.settle check a plain dict of known dimensions, a whole-number
timeout and a tenant seen before without the general machinery, and read the common replies
directly. Each property here runs random input through both and wants the same arguments, the
same error message, the same result.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from enum import IntEnum
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from ledger import DEFAULT_DIMENSIONS, MAX_AMOUNT, Ledger, LedgerInputError, replies
from ledger.client import DEFAULT_GRACE_S, DEFAULT_JOURNAL_MAXLEN
from ledger.inputs import check_amounts, check_tenant, flat_pairs, seconds_to_ms
from ledger.keys import tenant_keys


class Level(IntEnum):
    LOW = 1


class Frozen(Mapping[str, object]):
    """A Mapping that is not a dict."""

    def __init__(self, data: dict[str, object]) -> None:
        self._data = data

    def __getitem__(self, key: str) -> object:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)


def unreachable_ledger() -> Ledger:
    # Registering scripts does no I/O, and building script arguments does none either.
    return Ledger.from_url("redis://127.0.0.1:1/0", dimensions=(*DEFAULT_DIMENSIONS, "wall_ms"))


LEDGER = unreachable_ledger()

known = st.sampled_from(LEDGER.dimensions)
edge_values = st.sampled_from([MAX_AMOUNT, MAX_AMOUNT + 1, -1, True, False, 1.0, "3", None])
# Mostly well-formed, so that the later checks (the timeout) are reached too; then anything.
amounts = st.one_of(
    st.dictionaries(known, st.integers(0, 100) | edge_values | st.just(Level.LOW), max_size=5),
    st.dictionaries(
        known | st.sampled_from(["nope", "Tokens", ""]) | st.integers(0, 2),
        st.integers(-(2**70), 2**70) | edge_values,
        max_size=6,
    ),
)


def expected_pairs(amounts: object, *, allow_empty: bool) -> list[str] | str:
    try:
        return flat_pairs(check_amounts(amounts, LEDGER.dimensions, allow_empty=allow_empty))
    except LedgerInputError as exc:
        return str(exc)


def outcome(call: Any) -> Any:
    try:
        return call()
    except LedgerInputError as exc:
        return str(exc)


@given(amounts=amounts, as_mapping=st.booleans())
def test_settle_arguments_match_the_full_checks(
    amounts: dict[Any, object], as_mapping: bool
) -> None:
    """Same ARGV, or the same error, for any mapping of anything to anything."""
    given_amounts: Any = Frozen(amounts) if as_mapping else amounts
    got = outcome(lambda: LEDGER.settle_script_args("acme", "r", given_amounts))
    want = expected_pairs(given_amounts, allow_empty=True)
    if isinstance(want, str):
        assert got == want
    else:
        assert got == (tenant_keys("acme"), ["r", str(DEFAULT_JOURNAL_MAXLEN), *want])


@example(amounts={"tokens": 1}, timeout=True)
@example(amounts={"tokens": MAX_AMOUNT + 1}, timeout=1)
@example(amounts={"tokens": True}, timeout=1)
@given(
    amounts=amounts,
    timeout=st.one_of(
        st.integers(-1, 40 * 24 * 3600),
        st.floats(allow_nan=True, allow_infinity=True),
        st.sampled_from([True, False, 30 * 24 * 3600, 30 * 24 * 3600 + 1, "5"]),
    ),
)
def test_reserve_arguments_match_the_full_checks(amounts: dict[Any, object], timeout: Any) -> None:
    """Same ARGV, or the same error (amounts checked before the timeout), as before."""
    got = outcome(lambda: LEDGER.reserve_script_args("acme", "r", amounts, timeout_s=timeout))  # type: ignore[arg-type]
    want_pairs = expected_pairs(amounts, allow_empty=False)
    if isinstance(want_pairs, str):
        assert got == want_pairs
        return
    want_ms = outcome(lambda: seconds_to_ms("timeout_s", timeout))
    if isinstance(want_ms, str):
        assert got == want_ms
    else:
        grace_ms = seconds_to_ms("grace_s", DEFAULT_GRACE_S)
        argv = ["r", str(want_ms), str(grace_ms), str(DEFAULT_JOURNAL_MAXLEN), *want_pairs]
        assert got == (tenant_keys("acme"), argv)


@pytest.mark.parametrize("tenant", ["", "a b", "{t}", "x" * 129, 7, None])
def test_a_bad_tenant_is_refused_every_time(tenant: Any) -> None:
    """Checked names are remembered; refused ones are not."""
    ledger = unreachable_ledger()
    for _ in range(2):
        with pytest.raises(LedgerInputError) as raised:
            ledger.settle_script_args(tenant, "r", {})
        with pytest.raises(LedgerInputError) as direct:
            check_tenant(tenant)
        assert str(raised.value) == str(direct.value)


def test_returned_keys_are_the_callers_own() -> None:
    """Changing the KEYS one call returned does not change the next call's."""
    ledger = unreachable_ledger()
    keys, _ = ledger.settle_script_args("acme", "r", {})
    keys.append("mine")
    again, _ = ledger.reserve_script_args("acme", "r", {"tokens": 1}, timeout_s=1)
    assert again == tenant_keys("acme")


words = st.sampled_from(["admitted", "rejected", "conflict", "settled", "unknown", "x"])
scalars = st.one_of(st.integers(-1, 2), st.just(1_700_000_000_000), st.booleans(), words)
flat = st.lists(scalars, max_size=6)
reply_items = st.lists(st.one_of(scalars, flat, st.just([])), max_size=6)


def parsed(parse: Any, reply: list[Any]) -> Any:
    """The result, or the error's type and message, written as if the reply were a list."""
    try:
        return ("ok", parse(reply))
    except Exception as exc:  # any outcome must match, errors included
        message = str(exc).replace(repr(tuple(reply)), repr(reply))
        return (type(exc).__name__, message.replace("tuple index", "list index"))


@given(head=words, rest=reply_items)
def test_reserve_replies_read_the_same_fast_or_not(head: str, rest: list[Any]) -> None:
    """A list takes the fast path where it can; the same items as a tuple never do."""
    reply = [head, *rest]
    fast = parsed(replies.reserve, reply)
    assert fast == parsed(lambda items: replies.reserve(tuple(items)), reply)


@given(head=words, rest=reply_items)
def test_settle_replies_read_the_same_fast_or_not(head: str, rest: list[Any]) -> None:
    """As for reserve: the fast path changes nothing about the result."""
    reply = [head, *rest]
    fast = parsed(lambda items: replies.settle(items, "r"), reply)
    assert fast == parsed(lambda items: replies.settle(tuple(items), "r"), reply)


@pytest.mark.parametrize(
    ("reply", "want"),
    [
        (["admitted", 1_700_000_000_000, 0, [], 1], (1_700_000_000_000, False)),
        (["admitted", 5, 1, [], 0], (5, True)),
    ],
)
def test_common_admissions_are_read_directly(reply: list[Any], want: tuple[int, bool]) -> None:
    """The everyday reply still carries its deadline and replay flag."""
    result = replies.reserve(reply)
    assert (result.expires_at_ms, result.replayed, result.soft_exceeded) == (*want, ())
    assert result.admitted and result.status == "admitted"
