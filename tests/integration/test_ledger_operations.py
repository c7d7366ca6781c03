"""The ledger's operations against a real server: reserve, settle, release, expiry, periods."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from tests.integration.ledger_support import ClockedLedger, raw_usage
from turnstile.ledger import (
    MAX_AMOUNT,
    Ledger,
    LedgerConflict,
    LedgerInputError,
    LedgerUnknownReservation,
    Period,
    Rejection,
)
from turnstile.ledger.keys import PENDING_TENANTS, tenant_keys, usage_key
from turnstile.ledger.scripts import compose

pytestmark = pytest.mark.integration

DAY_MS = 86_400_000
T0 = int(datetime(2026, 1, 31, 23, 0, tzinfo=UTC).timestamp() * 1000)  # an hour before February


@pytest.fixture
def ledger(redis_url: str) -> Iterator[Ledger]:
    with Ledger.from_url(redis_url, grace_s=0) as ledger:
        yield ledger


@pytest.fixture
def clocked(redis_url: str) -> Iterator[ClockedLedger]:
    with ClockedLedger.from_url(redis_url, grace_s=0) as ledger:
        yield ledger


def test_reserve_admits_when_every_hard_dimension_fits(ledger: Ledger, unique: str) -> None:
    """An admitted reserve holds its amounts as reserved in every dimension it names."""
    ledger.set_ceiling(unique, "tokens", 1000)
    ledger.set_ceiling(unique, "steps", 10)
    held = ledger.reserve(unique, "r1", {"tokens": 1000, "steps": 1}, timeout_s=60)
    assert held.status == "admitted" and held.admitted and not held.replayed
    assert held.expires_at_ms is not None
    state = ledger.read(unique)
    assert (state["tokens"].committed, state["tokens"].reserved) == (0, 1000)
    assert (state["steps"].committed, state["steps"].reserved) == (0, 1)


def test_rejection_names_every_hard_dimension_in_order_and_writes_nothing(
    ledger: Ledger, unique: str
) -> None:
    """A reserve that does not fit lists each failing hard dimension, in dimension order, with
    what is available, and changes nothing, not even the journal."""
    ledger.set_ceiling(unique, "cost_microusd", 100)
    ledger.set_ceiling(unique, "tokens", 1000)
    ledger.set_ceiling(unique, "steps", 3)
    assert ledger.reserve(unique, "a", {"cost_microusd": 60, "steps": 2}, timeout_s=60).admitted
    before = (ledger.read(unique), len(ledger.journal(unique)), raw_usage(ledger, unique))
    result = ledger.reserve(
        unique, "b", {"cost_microusd": 50, "tokens": 10, "steps": 2}, timeout_s=60
    )
    assert result.status == "rejected" and not result.admitted
    assert result.rejected == (
        Rejection(dimension="steps", requested=2, available=1),
        Rejection(dimension="cost_microusd", requested=50, available=40),
    )
    assert result.first_rejected == "steps"
    assert (ledger.read(unique), len(ledger.journal(unique)), raw_usage(ledger, unique)) == before


def test_rejected_id_may_be_tried_again_once_there_is_room(ledger: Ledger, unique: str) -> None:
    """A rejection leaves no trace, so the same id is admitted once room is released."""
    ledger.set_ceiling(unique, "tokens", 100)
    assert ledger.reserve(unique, "big", {"tokens": 80}, timeout_s=60).admitted
    assert ledger.reserve(unique, "next", {"tokens": 30}, timeout_s=60).status == "rejected"
    ledger.release(unique, "big")
    again = ledger.reserve(unique, "next", {"tokens": 30}, timeout_s=60)
    assert again.admitted and not again.replayed


def test_soft_dimension_admits_and_flags_the_excess(ledger: Ledger, unique: str) -> None:
    """Going past a soft ceiling is admitted and reported, never refused."""
    ledger.set_ceiling(unique, "tokens", 10, hard=False)
    result = ledger.reserve(unique, "r", {"tokens": 25}, timeout_s=60)
    assert result.admitted and result.soft_exceeded == ("tokens",)
    assert ledger.read(unique)["tokens"].reserved == 25


def test_dimension_without_ceiling_is_unlimited_but_counted(ledger: Ledger, unique: str) -> None:
    """A dimension with no ceiling always fits and still shows its usage."""
    assert ledger.reserve(unique, "r", {"tool_calls": MAX_AMOUNT}, timeout_s=60).admitted
    ledger.settle(unique, "r", {"tool_calls": 7})
    row = ledger.read(unique)["tool_calls"]
    assert (row.ceiling, row.committed, row.reserved, row.period) == (None, 7, 0, Period.NONE)


def test_settle_books_actual_releases_the_rest_and_flags_overage(
    ledger: Ledger, unique: str
) -> None:
    """Settle commits the actual, frees the rest of the hold, and reports spend above it."""
    ledger.set_ceiling(unique, "cost_microusd", 1000)
    ledger.reserve(unique, "r", {"cost_microusd": 300, "tokens": 50}, timeout_s=60)
    settled = ledger.settle(unique, "r", {"cost_microusd": 120, "tokens": 80, "steps": 1})
    assert not settled.replayed and not settled.corrected
    assert settled.overage == {"steps": 1, "tokens": 30}
    state = ledger.read(unique)
    assert (state["cost_microusd"].committed, state["cost_microusd"].reserved) == (120, 0)
    assert (state["tokens"].committed, state["tokens"].reserved) == (80, 0)
    assert state["steps"].committed == 1


def test_settle_twice_is_a_replay_and_a_different_actual_a_conflict(
    ledger: Ledger, unique: str
) -> None:
    """The same settlement again changes nothing; another actual is refused."""
    ledger.reserve(unique, "r", {"tokens": 50}, timeout_s=60)
    ledger.settle(unique, "r", {"tokens": 20})
    again = ledger.settle(unique, "r", {"tokens": 20, "steps": 0})
    assert again.replayed and again.overage == {}
    with pytest.raises(LedgerConflict):
        ledger.settle(unique, "r", {"tokens": 21})
    with pytest.raises(LedgerConflict):
        ledger.release(unique, "r")
    assert ledger.read(unique)["tokens"].committed == 20
    assert [e.op for e in ledger.journal(unique)] == ["reserve", "settle"]


def test_release_is_a_settle_of_nothing(ledger: Ledger, unique: str) -> None:
    """Release frees the whole hold; a release or a zero settle after it is a replay."""
    ledger.reserve(unique, "r", {"tokens": 50}, timeout_s=60)
    assert not ledger.release(unique, "r").replayed
    assert ledger.release(unique, "r").replayed
    assert ledger.settle(unique, "r", {"tokens": 0}).replayed
    with pytest.raises(LedgerConflict):
        ledger.settle(unique, "r", {"tokens": 1})
    assert (ledger.read(unique)["tokens"].committed, ledger.read(unique)["tokens"].reserved) == (
        0,
        0,
    )


def test_settle_of_an_unknown_reservation_raises(ledger: Ledger, unique: str) -> None:
    """Settling an id that was never admitted is an error, and writes nothing."""
    with pytest.raises(LedgerUnknownReservation):
        ledger.settle(unique, "never", {"tokens": 1})
    with pytest.raises(LedgerUnknownReservation):
        ledger.release(unique, "never")
    assert ledger.journal(unique) == []


def test_reserve_replay_returns_the_first_answer(ledger: Ledger, unique: str) -> None:
    """The same id with the same amounts answers as the first time; other amounts conflict."""
    first = ledger.reserve(unique, "r", {"tokens": 50, "steps": 1}, timeout_s=60)
    again = ledger.reserve(unique, "r", {"steps": 1, "tokens": 50}, timeout_s=5)
    assert again.admitted and again.replayed and again.expires_at_ms == first.expires_at_ms
    other = ledger.reserve(unique, "r", {"tokens": 51, "steps": 1}, timeout_s=60)
    assert other.status == "conflict" and not other.admitted
    fewer = ledger.reserve(unique, "r", {"tokens": 50}, timeout_s=60)
    assert fewer.status == "conflict"
    assert ledger.read(unique)["tokens"].reserved == 50


def test_deadline_is_server_time_plus_timeout_plus_grace(redis_url: str, unique: str) -> None:
    """The deadline comes from the server's clock, the timeout and the grace margin."""
    with Ledger.from_url(redis_url, grace_s=2.5) as ledger:
        seconds, micros = ledger.client.time()
        before_ms = seconds * 1000 + micros // 1000
        held = ledger.reserve(unique, "r", {"tokens": 1}, timeout_s=0.25)
        assert held.expires_at_ms is not None
        assert before_ms + 2750 <= held.expires_at_ms <= before_ms + 2750 + 1000


def test_expiry_charges_in_full_and_a_late_settle_corrects(ledger: Ledger, unique: str) -> None:
    """Past its deadline a hold is committed in full; a settle afterwards books the actual."""
    ledger.set_ceiling(unique, "tokens", 100)
    ledger.reserve(unique, "r", {"tokens": 60}, timeout_s=0.05)
    time.sleep(0.1)
    row = ledger.read(unique)["tokens"]
    assert (row.committed, row.reserved) == (60, 0)
    assert ledger.reserve(unique, "s", {"tokens": 41}, timeout_s=60).status == "rejected"
    late = ledger.settle(unique, "r", {"tokens": 25})
    assert late.corrected and late.overage == {}
    row = ledger.read(unique)["tokens"]
    assert (row.committed, row.reserved) == (25, 0)
    assert [e.op for e in ledger.journal(unique)][-3:] == ["reserve", "expire", "settle"]


def test_no_expiry_before_the_deadline_to_the_millisecond(
    clocked: ClockedLedger, unique: str
) -> None:
    """A hold is still reserved at its deadline and charged only once the clock passes it."""
    clocked.set_clock(unique, T0)
    held = clocked.reserve(unique, "r", {"tokens": 9}, timeout_s=10)
    assert held.expires_at_ms == T0 + 10_000
    clocked.set_clock(unique, T0 + 10_000)
    assert clocked.read(unique)["tokens"].reserved == 9
    clocked.set_clock(unique, T0 + 10_001)
    assert clocked.read(unique)["tokens"].reserved == 0
    assert clocked.read(unique)["tokens"].committed == 9


def test_expiries_are_charged_in_deadline_order(clocked: ClockedLedger, unique: str) -> None:
    """Due holds are charged oldest deadline first, whatever order they were made in."""
    clocked.set_clock(unique, T0)
    for name, timeout_s in [("c", 30), ("a", 10), ("d", 40), ("b", 20)]:
        clocked.reserve(unique, name, {"tokens": 1}, timeout_s=timeout_s)
    clocked.set_clock(unique, T0 + 60_000)
    assert clocked.reap(unique) == 4
    expired = [e.id for e in clocked.journal(unique) if e.op == "expire"]
    assert expired == ["a", "b", "c", "d"]
    assert clocked.read(unique)["tokens"].reserved == 0


def test_day_and_month_periods_start_from_zero(clocked: ClockedLedger, unique: str) -> None:
    """A new day or month has its own usage; a hold stays booked in the period it began in."""
    clocked.set_clock(unique, T0)
    clocked.set_ceiling(unique, "tokens", 100, period="day")
    clocked.set_ceiling(unique, "cost_microusd", 100, period="month")
    clocked.set_ceiling(unique, "steps", 3)
    assert clocked.reserve(
        unique, "jan", {"tokens": 100, "cost_microusd": 100, "steps": 1}, timeout_s=7200
    ).admitted
    assert clocked.reserve(unique, "no", {"tokens": 1}, timeout_s=60).status == "rejected"

    clocked.set_clock(unique, T0 + 3_600_000)  # midnight: February 1st
    state = clocked.read(unique)
    assert (state["tokens"].bucket, state["tokens"].reserved) == ("2026-02-01", 0)
    assert (state["cost_microusd"].bucket, state["cost_microusd"].reserved) == ("2026-02", 0)
    assert (state["steps"].bucket, state["steps"].reserved) == ("all", 1)
    assert clocked.reserve(
        unique, "feb", {"tokens": 100, "cost_microusd": 100, "steps": 1}, timeout_s=60
    ).admitted

    clocked.settle(unique, "jan", {"tokens": 40, "cost_microusd": 30, "steps": 1})
    usage = raw_usage(clocked, unique)
    assert usage["c:tokens:2026-01-31"] == 40 and usage["r:tokens:2026-01-31"] == 0
    assert usage["c:cost_microusd:2026-01"] == 30
    assert usage["r:tokens:2026-02-01"] == 100 and usage.get("c:tokens:2026-02-01", 0) == 0
    assert (usage["c:steps:all"], usage["r:steps:all"]) == (1, 1)

    clocked.set_clock(unique, T0 + 3_600_000 + DAY_MS)
    assert clocked.reserve(unique, "feb2", {"tokens": 100}, timeout_s=60).admitted
    assert clocked.reserve(unique, "feb2-cost", {"cost_microusd": 1}, timeout_s=60).status == (
        "rejected"
    )


def test_set_ceiling_is_idempotent_by_operation_id(ledger: Ledger, unique: str) -> None:
    """The same operation id repeats as a replay; reused for another setting it conflicts."""
    first = ledger.set_ceiling(unique, "tokens", 10, op_id="op-1")
    again = ledger.set_ceiling(unique, "tokens", 10, op_id="op-1")
    assert not first.replayed and again.replayed
    with pytest.raises(LedgerConflict):
        ledger.set_ceiling(unique, "tokens", 11, op_id="op-1")
    ledger.set_ceiling(unique, "tokens", 20, hard=False, period="month", op_id="op-2")
    row = ledger.read(unique)["tokens"]
    assert (row.ceiling, row.hard, row.period) == (20, False, Period.MONTH)
    assert [e.id for e in ledger.journal(unique)] == ["op-1", "op-2"]


def test_read_lists_dimensions_with_a_ceiling_or_usage(ledger: Ledger, unique: str) -> None:
    """Read shows configured and used dimensions, in dimension order, and nothing else."""
    assert ledger.read(unique) == {}
    ledger.set_ceiling(unique, "cost_microusd", 5)
    ledger.reserve(unique, "r", {"tokens": 1, "steps": 1}, timeout_s=60)
    assert list(ledger.read(unique)) == ["steps", "tokens", "cost_microusd"]


def test_rebuild_recomputes_reserved_from_pending_holds(ledger: Ledger, unique: str) -> None:
    """Rebuild repairs a reserved figure that drifted, and journals the repair."""
    ledger.reserve(unique, "a", {"tokens": 10}, timeout_s=60)
    ledger.reserve(unique, "b", {"tokens": 5, "steps": 1}, timeout_s=60)
    ledger.settle(unique, "a", {"tokens": 10})
    assert ledger.rebuild(unique).corrected_fields == 0
    ledger.client.hset(usage_key(unique), "r:tokens:all", "999")
    ledger.client.hset(usage_key(unique), "r:cost_microusd:all", "3")
    result = ledger.rebuild(unique)
    assert (result.pending, result.corrected_fields) == (1, 2)
    state = ledger.read(unique)
    assert (state["tokens"].reserved, state["steps"].reserved) == (5, 1)
    assert raw_usage(ledger, unique)["r:cost_microusd:all"] == 0
    assert ledger.journal(unique)[-1].op == "rebuild"


def test_reap_all_charges_idle_tenants_and_forgets_them(ledger: Ledger, unique: str) -> None:
    """The reaper finds a tenant nobody touches, charges its due holds, then drops it."""
    ledger.reserve(unique, "r", {"tokens": 4}, timeout_s=0.01)
    assert ledger.client.sismember(PENDING_TENANTS, unique)
    time.sleep(0.05)
    assert ledger.reap_all() >= 1
    assert not ledger.client.sismember(PENDING_TENANTS, unique)
    assert ledger.read(unique)["tokens"].committed == 4
    ledger.reserve(unique, "s", {"tokens": 4}, timeout_s=60)
    ledger.reap_all()
    assert ledger.client.sismember(PENDING_TENANTS, unique)


def test_resolved_records_are_forgotten_after_retention(redis_url: str, unique: str) -> None:
    """After the retention period a resolved id is pruned; a pending one never is."""
    with ClockedLedger.from_url(redis_url, grace_s=0, retention_s=3600) as clocked:
        clocked.set_clock(unique, T0)
        clocked.reserve(unique, "done", {"tokens": 1}, timeout_s=60)
        clocked.reserve(unique, "open", {"tokens": 1}, timeout_s=3 * 86400)
        clocked.settle(unique, "done", {"tokens": 1})
        clocked.set_clock(unique, T0 + 2 * 3_600_000)
        clocked.reap(unique)
        with pytest.raises(LedgerUnknownReservation):
            clocked.settle(unique, "done", {"tokens": 1})
        assert not clocked.settle(unique, "open", {"tokens": 1}).replayed


@pytest.mark.parametrize(
    ("amounts", "message"),
    [
        ({"bogus": 1}, "unknown dimension"),
        ({"Tokens": 1}, "bad dimension name"),
        ({"tokens": -1}, r"0\.\.2\^53"),
        ({"tokens": 1.0}, "integer"),
        ({"tokens": True}, "integer"),
        ({"tokens": "5"}, "integer"),
        ({"tokens": MAX_AMOUNT + 1}, r"0\.\.2\^53"),
        ({}, "nothing to reserve"),
    ],
)
def test_bad_amounts_raise_before_any_write(
    ledger: Ledger, unique: str, amounts: dict[str, object], message: str
) -> None:
    """Bad amounts raise a clear LedgerInputError and leave the server untouched."""
    with pytest.raises(LedgerInputError, match=message):
        ledger.reserve(unique, "r", amounts, timeout_s=60)  # type: ignore[arg-type]
    assert ledger.client.exists(*tenant_keys(unique)) == 0


@pytest.mark.parametrize(
    ("tenant", "reservation_id"), [("", "r"), ("a{b", "r"), ("t", ""), ("t", "a b")]
)
def test_empty_or_malformed_names_raise_before_any_write(
    ledger: Ledger, tenant: str, reservation_id: str
) -> None:
    """An empty or malformed tenant or id is refused before anything is sent."""
    with pytest.raises(LedgerInputError):
        ledger.reserve(tenant, reservation_id, {"tokens": 1}, timeout_s=60)
    with pytest.raises(LedgerInputError):
        ledger.settle(tenant, reservation_id, {"tokens": 1})


def test_scripts_validate_everything_before_the_first_write(ledger: Ledger, unique: str) -> None:
    """Called directly with a bad second pair, the reserve script refuses and writes nothing."""
    script = ledger.client.register_script(compose("reserve"))
    reply = script(
        keys=tenant_keys(unique),
        args=["r", "1000", "0", "100", "tokens", "5", "steps", "-1"],
    )
    assert reply[0] == "invalid"
    reply = script(keys=tenant_keys(unique), args=["r", "1000", "0", "100", "tokens", "5", "x"])
    assert reply[0] == "invalid"
    assert ledger.client.exists(*tenant_keys(unique)) == 0


def test_totals_may_not_pass_two_to_the_53(ledger: Ledger, unique: str) -> None:
    """A reserve that would take a total past 2^53 is refused by the script, unwritten."""
    ledger.reserve(unique, "a", {"tokens": MAX_AMOUNT}, timeout_s=60)
    with pytest.raises(LedgerInputError, match="2\\^53"):
        ledger.reserve(unique, "b", {"tokens": 1}, timeout_s=60)
    assert ledger.read(unique)["tokens"].reserved == MAX_AMOUNT
