"""The library contract: another script embeds ledger_settle and stays atomic with it."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from turnstile.ledger import Ledger
from turnstile.ledger.keys import tenant_key
from turnstile.ledger.scripts import library_source

pytestmark = pytest.mark.integration

# A miniature of the worker's commit: settle the turn's hold, and only if that succeeded,
# write the run's state. KEYS: the six ledger keys, then the run key; ARGV: the new state,
# then ledger_settle's argv.
COMMIT = """
local argv = {}
for i = 2, #ARGV do
  argv[#argv + 1] = ARGV[i]
end
local res = ledger_settle({ KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6] }, argv)
if res[1] ~= 'settled' then
  return res
end
redis.call('SET', KEYS[7], ARGV[1])
return res
"""


@pytest.fixture
def ledger(redis_url: str) -> Iterator[Ledger]:
    with Ledger.from_url(redis_url, grace_s=0) as ledger:
        yield ledger


def test_a_composed_script_settles_and_writes_in_one_step(ledger: Ledger, unique: str) -> None:
    """A script made of the library plus a few lines settles the hold and writes its own key;
    a conflicting settle writes neither."""
    commit = ledger.client.register_script(library_source() + COMMIT)
    run_key = tenant_key(unique, "run:r1")
    ledger.reserve(unique, "r1:3", {"tokens": 100, "cost_microusd": 50}, timeout_s=60)

    keys, argv = ledger.settle_script_args(unique, "r1:3", {"tokens": 120, "cost_microusd": 40})
    reply = commit(keys=[*keys, run_key], args=["version-4", *argv])
    assert reply == ["settled", 0, ["tokens", 20], 0]
    assert ledger.client.get(run_key) == "version-4"
    state = ledger.read(unique)
    assert (state["tokens"].committed, state["tokens"].reserved) == (120, 0)
    assert (state["cost_microusd"].committed, state["cost_microusd"].reserved) == (40, 0)

    assert commit(keys=[*keys, run_key], args=["version-4", *argv])[:2] == ["settled", 1]
    _, other = ledger.settle_script_args(unique, "r1:3", {"tokens": 1})
    assert commit(keys=[*keys, run_key], args=["version-5", *other]) == ["conflict"]
    assert ledger.client.get(run_key) == "version-4"
    _, unknown = ledger.settle_script_args(unique, "r1:99", {})
    assert commit(keys=[*keys, run_key], args=["version-5", *unknown]) == ["unknown"]


# Two settlements, all or nothing: check both, then settle both.
SETTLE_BOTH = """
local keys = { KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6] }
local first, second = { ARGV[1], ARGV[2], ARGV[3], ARGV[4] }, { ARGV[5], ARGV[6], ARGV[7], ARGV[8] }
for _, argv in ipairs({ first, second }) do
  local refusal = ledger_settle_check(keys, argv)
  if refusal then
    return refusal
  end
end
ledger_settle(keys, first)
ledger_settle(keys, second)
return { 'ok' }
"""


def test_several_settlements_are_checked_before_any_is_written(ledger: Ledger, unique: str) -> None:
    """ledger_settle_check finds the refusal of a later settlement before the first one writes."""
    both = ledger.client.register_script(library_source() + SETTLE_BOTH)
    ledger.reserve(unique, "a", {"tokens": 10}, timeout_s=60)
    ledger.reserve(unique, "b", {"tokens": 10}, timeout_s=60)
    ledger.settle(unique, "b", {"tokens": 3})
    keys, first = ledger.settle_script_args(unique, "a", {"tokens": 4})
    _, clash = ledger.settle_script_args(unique, "b", {"tokens": 5})
    assert both(keys=keys, args=[*first, *clash]) == ["conflict"]
    assert ledger.read(unique)["tokens"].reserved == 10  # "a" untouched
    _, same = ledger.settle_script_args(unique, "b", {"tokens": 3})
    assert both(keys=keys, args=[*first, *same]) == ["ok"]
    row = ledger.read(unique)["tokens"]
    assert (row.committed, row.reserved) == (7, 0)


# A miniature of the worker's load: read the run, and reserve in the same step only when the
# run is live. KEYS: the six ledger keys, then the run key; ARGV: ledger_reserve's argv.
LOAD = """
if redis.call('GET', KEYS[7]) ~= 'live' then
  return { 'idle' }
end
return ledger_reserve({ KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6] }, ARGV)
"""


def test_a_composed_script_reserves_as_reserve_does(ledger: Ledger, unique: str) -> None:
    """An embedded reserve admits, replays, refuses and rejects exactly like Ledger.reserve,
    and writes nothing when the embedding script decides not to call it."""
    load = ledger.client.register_script(library_source() + LOAD)
    run_key = tenant_key(unique, "run:r1")
    ledger.set_ceiling(unique, "tokens", 100)
    keys, argv = ledger.reserve_script_args(unique, "r1:1", {"tokens": 60}, timeout_s=30)
    assert load(keys=[*keys, run_key], args=argv) == ["idle"]
    assert ledger.read(unique)["tokens"].reserved == 0
    ledger.client.set(run_key, "live")
    admitted = load(keys=[*keys, run_key], args=argv)
    assert admitted[0] == "admitted" and admitted[2] == 0
    assert load(keys=[*keys, run_key], args=argv)[:3] == ["admitted", admitted[1], 1]
    _, more = ledger.reserve_script_args(unique, "r1:1", {"tokens": 61}, timeout_s=30)
    assert load(keys=[*keys, run_key], args=more) == ["conflict"]
    _, other = ledger.reserve_script_args(unique, "r1:2", {"tokens": 41}, timeout_s=30)
    assert load(keys=[*keys, run_key], args=other) == ["rejected", ["tokens", 41, 40], []]
    assert ledger.read(unique)["tokens"].reserved == 60
    assert ledger.settle(unique, "r1:1", {"tokens": 10}).overage == {}


def test_the_library_defines_no_globals(ledger: Ledger) -> None:
    """The library loads in a script on its own: everything in it is local."""
    assert ledger.client.eval(library_source() + "\nreturn 1", 0) == 1


BUCKET = "return ledger_bucket(ARGV[1], tonumber(ARGV[2]))"


@settings(max_examples=60, deadline=None)
@given(
    moment=st.datetimes(
        min_value=datetime(1970, 1, 1), max_value=datetime(2999, 12, 31, 23, 59, 59)
    )
)
def test_period_buckets_match_the_utc_calendar(redis_url: str, moment: datetime) -> None:
    """The Lua calendar names the same UTC day and month as Python's."""
    ms = int(moment.replace(tzinfo=UTC).timestamp() * 1000)
    with Ledger.from_url(redis_url) as ledger:
        bucket = ledger.client.register_script(library_source() + "\n" + BUCKET)
        assert bucket(args=["day", ms]) == moment.strftime("%Y-%m-%d")
        assert bucket(args=["month", ms]) == moment.strftime("%Y-%m")
        assert bucket(args=["none", ms]) == "all"
