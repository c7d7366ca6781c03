"""The fair-share policy, without I/O: weighted round robin between tenants and tenant settings."""

from __future__ import annotations

import pytest
import redis

from turnstile.worker.scheduling.dispatcher import LINGER_S, Dispatcher, RoundRobin
from turnstile.worker.scheduling.fair import CapError, parse_caps
from turnstile.worker.settings import Settings
from turnstile.worker.store.durability import Durability


def _picks(rr: RoundRobin, tenants: list[str], weights: dict[str, int], n: int) -> list[str]:
    return [str(rr.pick(tenants, weights)) for _ in range(n)]


def test_round_robin_takes_one_step_per_tenant_in_turn() -> None:
    """Without weights every tenant with work gets one step in turn, however long its backlog."""
    assert _picks(RoundRobin(), ["a", "b", "c"], {}, 6) == ["a", "b", "c", "a", "b", "c"]


def test_a_weight_gives_that_many_steps_in_a_row() -> None:
    """A tenant of weight 3 gets three steps for another's one."""
    assert _picks(RoundRobin(), ["a", "b"], {"a": 3}, 8) == ["a", "a", "a", "b"] * 2


def test_a_skipped_tenant_loses_the_rest_of_its_turn() -> None:
    """A tenant that cannot send (capped, empty) hands over to the next one at once."""
    rr = RoundRobin()
    assert rr.pick(["a", "b"], {"a": 5}) == "a"
    rr.skip()
    assert rr.pick(["a", "b"], {"a": 5}) == "b"


def test_round_robin_goes_on_after_a_tenant_that_left() -> None:
    """The turn moves to the tenant after the last one served, even if that one has gone."""
    rr = RoundRobin()
    assert _picks(rr, ["a", "b", "c"], {}, 2) == ["a", "b"]
    assert rr.pick(["a", "c"], {}) == "c"
    assert rr.pick([], {}) is None


def test_caps_parse_and_none_removes_a_cap() -> None:
    """`turns_in_flight=20 weight=2` are settings; `turns_in_flight=none` removes the cap."""
    assert parse_caps(["turns_in_flight=20", "weight=2"]) == {"turns_in_flight": 20, "weight": 2}
    assert parse_caps(["turns_in_flight=none"]) == {"turns_in_flight": None}
    assert parse_caps(["active_runs=100", "active_runs=none"]) == {"active_runs": None}


@pytest.mark.parametrize(
    "pair", ["turns_in_flight=-1", "turns_in_flight=1.5", "turns_in_flight=0", "weight=0",
             "weight=-2", "weight=none", "weight=x", "cap=3", "turns_in_flight"],
)  # fmt: skip
def test_bad_settings_are_refused(pair: str) -> None:
    """A negative, fractional or zero cap, a zero weight or an unknown name is a clear error."""
    with pytest.raises(CapError):
        parse_caps([pair])


def test_nothing_to_set_is_refused() -> None:
    """`tenants set acme` with no setting says so."""
    with pytest.raises(CapError, match="nothing to set"):
        parse_caps([])


@pytest.mark.parametrize(
    ("durability", "linger_s"),
    [(Durability.NONE, LINGER_S), (Durability.AOF, LINGER_S), (Durability.REPLICA, 0.0)],
)
def test_the_dispatcher_lingers_unless_its_durability_waits_after_the_write(
    durability: Durability, linger_s: float
) -> None:
    """The pause between passes is off only for `replica`, whose WAIT after the write is
    answered when the server's loop next turns; `aof`'s WAITAOF goes before the write and is
    answered at once, so it lingers as `none` does."""
    config = Settings(durability=durability)
    client = redis.Redis(port=1)  # never reached: building a dispatcher sends nothing
    assert Dispatcher(client, None, config, lambda batch: None).linger_s == linger_s
