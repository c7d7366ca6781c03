"""Pruning old period buckets: the current and previous periods stay, and so does every bucket
a pending or an expired, unsettled reservation still books in."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from tests.integration.ledger_support import ClockedLedger, raw_usage

pytestmark = pytest.mark.integration

DAY_MS = 86_400_000
MARCH_5 = int(datetime(2026, 3, 5, 12, 0, tzinfo=UTC).timestamp() * 1000)


@pytest.fixture
def clocked(redis_url: str) -> Iterator[ClockedLedger]:
    with ClockedLedger.from_url(redis_url, grace_s=0) as ledger:
        yield ledger


def _spend_on(ledger: ClockedLedger, tenant: str, at_ms: int, name: str) -> None:
    ledger.set_clock(tenant, at_ms)
    assert ledger.reserve(tenant, name, {"tokens": 5, "cost_microusd": 7}, timeout_s=60).admitted
    ledger.settle(tenant, name, {"tokens": 3, "cost_microusd": 4})


def _buckets(ledger: ClockedLedger, tenant: str) -> set[str]:
    return {field.split(":")[2] for field in raw_usage(ledger, tenant)}


def test_old_day_and_month_buckets_are_pruned_and_recent_ones_kept(
    clocked: ClockedLedger, unique: str
) -> None:
    """Days before yesterday and months before last month are forgotten, with a journal entry;
    today's and yesterday's, this month's and last month's figures are unchanged."""
    clocked.set_clock(unique, MARCH_5)
    clocked.set_ceiling(unique, "tokens", 1000, period="day")
    clocked.set_ceiling(unique, "cost_microusd", 1000, period="month")
    clocked.set_ceiling(unique, "steps", 1000)
    for days_ago in (40, 10, 3, 2, 1, 0):
        _spend_on(clocked, unique, MARCH_5 - days_ago * DAY_MS, f"r{days_ago}")
    clocked.reserve(unique, "steps", {"steps": 1}, timeout_s=60)
    before = clocked.read(unique)
    assert _buckets(clocked, unique) >= {"2026-01-24", "2026-02-23", "2026-03-02", "2026-01"}

    pruned = clocked.prune_periods(unique)

    assert pruned == ("2026-01", "2026-01-24", "2026-02-23", "2026-03-02", "2026-03-03")
    assert _buckets(clocked, unique) == {"2026-03-04", "2026-03-05", "2026-02", "2026-03", "all"}
    assert clocked.read(unique) == before
    entry = clocked.journal(unique, count=1)[0]
    assert entry.op == "prune" and entry.changes == ()
    assert "c:tokens:2026-01-24=3" in entry.fields["removed"]
    assert clocked.prune_periods(unique) == ()  # nothing old is left


def test_a_bucket_with_a_pending_reservation_is_kept_until_it_is_settled(
    clocked: ClockedLedger, unique: str
) -> None:
    """A hold taken five days ago that is still pending keeps its day's bucket; once settled
    (booked there) the bucket goes at the next prune."""
    start = MARCH_5 - 5 * DAY_MS
    clocked.set_clock(unique, start)
    clocked.set_ceiling(unique, "tokens", 1000, period="day")
    assert clocked.reserve(unique, "long", {"tokens": 50}, timeout_s=10 * 86400).admitted
    clocked.set_clock(unique, MARCH_5)

    assert clocked.prune_periods(unique) == ()
    assert raw_usage(clocked, unique)["r:tokens:2026-02-28"] == 50

    clocked.settle(unique, "long", {"tokens": 20})
    assert raw_usage(clocked, unique)["c:tokens:2026-02-28"] == 20
    assert clocked.prune_periods(unique) == ("2026-02-28",)
    assert "c:tokens:2026-02-28" not in raw_usage(clocked, unique)


def test_a_bucket_with_an_expired_unsettled_reservation_is_kept_for_its_late_settle(
    clocked: ClockedLedger, unique: str
) -> None:
    """A hold that expired (charged in full) may still be corrected by a late settle in its
    own bucket, so the bucket stays until it is; then the correction lands and it goes."""
    start = MARCH_5 - 4 * DAY_MS
    clocked.set_clock(unique, start)
    clocked.set_ceiling(unique, "tokens", 1000, period="day")
    assert clocked.reserve(unique, "late", {"tokens": 30}, timeout_s=60).admitted
    clocked.set_clock(unique, MARCH_5)
    clocked.read(unique)  # charges the expiry: the record is expired, unsettled
    assert raw_usage(clocked, unique)["c:tokens:2026-03-01"] == 30

    assert clocked.prune_periods(unique) == ()

    assert clocked.settle(unique, "late", {"tokens": 12}).corrected
    assert raw_usage(clocked, unique)["c:tokens:2026-03-01"] == 12
    assert clocked.prune_periods(unique) == ("2026-03-01",)
