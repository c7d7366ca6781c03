"""Hypothesis drives the ledger on a real server against a model of what it must hold.

The scripts run on a simulated clock (see ledger_support), so examples cross deadlines and
day and month boundaries freely. After every step the server's figures must equal the model's,
reserved must equal the pending holds, committed the settled actuals plus expired charges, and
the journal must add up to both.
"""

from __future__ import annotations

import uuid
from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    multiple,
    precondition,
    rule,
    run_state_machine_as_test,
)

from tests.integration.ledger_support import ClockedLedger, raw_usage
from turnstile.ledger import LedgerConflict, LedgerUnknownReservation, Period, Rejection
from turnstile.ledger.inputs import in_dimension_order

pytestmark = pytest.mark.integration

DIMS = ("steps", "tool_calls", "tokens", "cost_microusd")
T0 = int(datetime(2026, 1, 31, 22, 0, tzinfo=UTC).timestamp() * 1000)
GRACE_MS = 1000
MAX_HOLDS = 14  # below the 16 expiries a script charges per call, so the model stays exact
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def bucket(period: Period, ms: int) -> str:
    if period is Period.NONE:
        return "all"
    moment = EPOCH + timedelta(milliseconds=ms)
    return moment.strftime("%Y-%m-%d" if period is Period.DAY else "%Y-%m")


@dataclass
class Limit:
    ceiling: int | None = None
    hard: bool = True
    period: Period = Period.NONE


@dataclass
class Hold:
    amounts: dict[str, int]
    buckets: dict[str, str]
    created_ms: int
    deadline_ms: int
    soft: tuple[str, ...]
    state: str = "pending"  # pending, expired, settled
    actual: dict[str, int] = field(default_factory=dict)
    actual_buckets: dict[str, str] = field(default_factory=dict)


amounts_strategy = st.dictionaries(
    st.sampled_from(DIMS), st.integers(0, 60), min_size=1, max_size=len(DIMS)
)
actual_strategy = st.dictionaries(st.sampled_from(DIMS), st.integers(0, 80), max_size=len(DIMS))


class LedgerMachine(RuleBasedStateMachine):
    holds_bundle = Bundle("holds")

    def __init__(self, ledger: ClockedLedger) -> None:
        super().__init__()
        self.ledger = ledger
        self.tenant = uuid.uuid4().hex[:12]
        self.now = T0
        self.limits: dict[str, Limit] = {}
        self.holds: dict[str, Hold] = {}
        self.counter = 0
        self.ledger.set_clock(self.tenant, self.now)

    # --- the model ---------------------------------------------------------------------

    def limit(self, dim: str) -> Limit:
        return self.limits.setdefault(dim, Limit())

    def expire_due(self) -> None:
        for hold in self.holds.values():
            if hold.state == "pending" and hold.deadline_ms < self.now:
                hold.state = "expired"

    def expected_usage(self) -> dict[str, int]:
        """Usage fields from the holds alone: the conservation laws."""
        usage: Counter[str] = Counter()
        for hold in self.holds.values():
            for dim, amount in hold.amounts.items():
                if hold.state == "pending":
                    usage[f"r:{dim}:{hold.buckets[dim]}"] += amount
                elif hold.state == "expired":
                    usage[f"c:{dim}:{hold.buckets[dim]}"] += amount
            if hold.state == "settled":
                for dim, amount in hold.actual.items():
                    usage[f"c:{dim}:{hold.actual_buckets[dim]}"] += amount
        return {k: v for k, v in usage.items() if v}

    def used(self, dim: str, at_bucket: str) -> int:
        usage = self.expected_usage()
        return usage.get(f"c:{dim}:{at_bucket}", 0) + usage.get(f"r:{dim}:{at_bucket}", 0)

    # --- rules ---------------------------------------------------------------------------

    @initialize(
        ceilings=st.dictionaries(
            st.sampled_from(DIMS),
            st.tuples(st.integers(0, 150), st.booleans(), st.sampled_from(list(Period))),
        )
    )
    def configure(self, ceilings: Mapping[str, tuple[int, bool, Period]]) -> None:
        for dim, (ceiling, hard, period) in ceilings.items():
            self.set_ceiling(dim, ceiling, hard, period)

    @rule(
        dim=st.sampled_from(DIMS),
        ceiling=st.integers(0, 150),
        hard=st.booleans(),
        period=st.sampled_from(list(Period)),
    )
    def set_ceiling(self, dim: str, ceiling: int, hard: bool, period: Period) -> None:
        self.ledger.set_clock(self.tenant, self.now)
        self.ledger.set_ceiling(self.tenant, dim, ceiling, hard=hard, period=period.value)
        self.expire_due()
        self.limits[dim] = Limit(ceiling, hard, period)

    @precondition(lambda self: len(self.holds) < MAX_HOLDS)
    @rule(target=holds_bundle, amounts=amounts_strategy, timeout_ms=st.integers(0, 200_000))
    def reserve(self, amounts: dict[str, int], timeout_ms: int) -> object:
        self.counter += 1
        hold_id = f"h{self.counter}"
        self.ledger.set_clock(self.tenant, self.now)
        result = self.ledger.reserve(self.tenant, hold_id, amounts, timeout_s=timeout_ms / 1000)
        self.expire_due()
        buckets = {d: bucket(self.limit(d).period, self.now) for d in amounts}
        rejected, soft = [], []
        for dim in in_dimension_order(amounts):
            lim, used = self.limit(dim), self.used(dim, buckets[dim])
            if lim.ceiling is not None and used + amounts[dim] > lim.ceiling:
                if lim.hard:
                    rejected.append(Rejection(dimension=dim, requested=amounts[dim],
                                              available=max(0, lim.ceiling - used)))  # fmt: skip
                else:
                    soft.append(dim)
        assert result.soft_exceeded == tuple(soft)
        if rejected:
            assert result.status == "rejected" and result.rejected == tuple(rejected)
            return multiple()
        assert result.status == "admitted" and not result.replayed
        assert result.expires_at_ms == self.now + timeout_ms + GRACE_MS
        self.holds[hold_id] = Hold(
            dict(amounts), buckets, self.now, result.expires_at_ms, tuple(soft)
        )
        # Admission safety: right after an admitted reserve, every hard ceiling it named holds.
        state = self.ledger.read(self.tenant)
        for dim in amounts:
            lim = self.limit(dim)
            if lim.hard and lim.ceiling is not None:
                assert state[dim].committed + state[dim].reserved <= lim.ceiling
        return hold_id

    @rule(hold_id=holds_bundle, timeout_ms=st.integers(0, 10_000))
    def replay_reserve(self, hold_id: str, timeout_ms: int) -> None:
        hold = self.holds[hold_id]
        self.ledger.set_clock(self.tenant, self.now)
        result = self.ledger.reserve(
            self.tenant, hold_id, hold.amounts, timeout_s=timeout_ms / 1000
        )
        self.expire_due()
        assert result.admitted and result.replayed
        assert result.expires_at_ms == hold.deadline_ms
        assert result.soft_exceeded == hold.soft

    @rule(hold_id=holds_bundle, other=amounts_strategy)
    def conflicting_reserve(self, hold_id: str, other: dict[str, int]) -> None:
        if other == self.holds[hold_id].amounts:
            return
        self.ledger.set_clock(self.tenant, self.now)
        result = self.ledger.reserve(self.tenant, hold_id, other, timeout_s=1)
        self.expire_due()
        assert result.status == "conflict" and not result.admitted

    @rule(hold_id=holds_bundle, actual=actual_strategy)
    def settle(self, hold_id: str, actual: dict[str, int]) -> None:
        hold = self.holds[hold_id]
        self.ledger.set_clock(self.tenant, self.now)
        if hold.state == "settled":
            if {d: a for d, a in actual.items() if a} == hold.actual:
                assert self.ledger.settle(self.tenant, hold_id, actual).replayed
            else:
                try:
                    self.ledger.settle(self.tenant, hold_id, actual)
                except LedgerConflict:
                    pass
                else:
                    raise AssertionError("a different actual was accepted")
            self.expire_due()
            return
        result = self.ledger.settle(self.tenant, hold_id, actual)
        self.expire_due()
        assert result.corrected == (hold.state == "expired")
        assert result.overage == {
            d: a - hold.amounts.get(d, 0) for d, a in actual.items() if a > hold.amounts.get(d, 0)
        }
        hold.state = "settled"
        hold.actual = {d: a for d, a in actual.items() if a}
        hold.actual_buckets = {
            d: hold.buckets.get(d) or bucket(self.limit(d).period, hold.created_ms)
            for d in hold.actual
        }

    @rule(hold_id=consumes(holds_bundle))
    def release(self, hold_id: str) -> None:
        self.settle(hold_id, {})

    @rule()
    def settle_unknown(self) -> None:
        self.ledger.set_clock(self.tenant, self.now)
        try:
            self.ledger.settle(self.tenant, "never-made", {"tokens": 1})
        except LedgerUnknownReservation:
            pass
        else:
            raise AssertionError("an unknown reservation was settled")
        self.expire_due()

    @rule(ms=st.one_of(st.integers(0, 300_000), st.integers(0, 3 * 86_400_000)))
    def advance(self, ms: int) -> None:
        self.now += ms

    @rule(hold_id=holds_bundle, offset_ms=st.sampled_from([-1, 0, 1]))
    def advance_to_a_deadline(self, hold_id: str, offset_ms: int) -> None:
        """Stand exactly at, just before or just after a deadline: the edge that matters."""
        self.now = max(self.now, self.holds[hold_id].deadline_ms + offset_ms)

    @rule()
    def reap(self) -> None:
        self.ledger.set_clock(self.tenant, self.now)
        due = sum(
            1 for h in self.holds.values() if h.state == "pending" and h.deadline_ms < self.now
        )
        assert self.ledger.reap(self.tenant) == due
        self.expire_due()

    @rule()
    def pass_every_deadline(self) -> None:
        """Once every deadline has passed and the reaper ran, nothing is reserved."""
        self.now = max([self.now, *(h.deadline_ms + 1 for h in self.holds.values())])
        self.reap()
        assert all(v == 0 for k, v in raw_usage(self.ledger, self.tenant).items() if k[0] == "r")

    # --- invariants ----------------------------------------------------------------------

    @invariant()
    def figures_match_the_holds(self) -> None:
        """Reserved is the pending holds; committed is settled actuals plus expired charges."""
        self.ledger.set_clock(self.tenant, self.now)
        state = self.ledger.read(self.tenant)  # charges due expiries, as the model does
        self.expire_due()
        expected = self.expected_usage()
        raw = {k: v for k, v in raw_usage(self.ledger, self.tenant).items() if v}
        assert raw == expected
        for dim, row in state.items():
            lim = self.limit(dim)
            assert (row.ceiling, row.hard, row.period) == (lim.ceiling, lim.hard, lim.period)
            assert row.bucket == bucket(lim.period, self.now)
            assert row.committed == expected.get(f"c:{dim}:{row.bucket}", 0)
            assert row.reserved == expected.get(f"r:{dim}:{row.bucket}", 0)

    @invariant()
    def journal_adds_up_and_resolves_each_hold_once(self) -> None:
        """The journal's changes sum to the figures; no hold expires early or resolves twice."""
        totals: defaultdict[str, int] = defaultdict(int)
        resolutions: Counter[tuple[str, str]] = Counter()
        for entry in self.ledger.journal(self.tenant):
            for ch in entry.changes:
                totals[f"c:{ch.dimension}:{ch.bucket}"] += ch.committed_delta
                totals[f"r:{ch.dimension}:{ch.bucket}"] += ch.reserved_delta
            if entry.op in ("settle", "release", "expire"):
                resolutions[(entry.id, "expire" if entry.op == "expire" else "resolve")] += 1
            if entry.op == "expire":
                assert entry.at_ms > self.holds[entry.id].deadline_ms
        assert {k: v for k, v in totals.items() if v} == self.expected_usage()
        assert all(count == 1 for count in resolutions.values())


# Hypothesis shrinks a failure for up to five minutes; let it finish and report the small case.
@pytest.mark.timeout(600)
def test_ledger_state_machine(redis_url: str) -> None:
    """The ledger agrees with its model through any sequence of operations and clock moves."""
    with ClockedLedger.from_url(redis_url, grace_s=GRACE_MS / 1000) as ledger:

        class OnThisServer(LedgerMachine):
            def __init__(self) -> None:
                super().__init__(ledger)

        run_state_machine_as_test(
            OnThisServer,
            settings=settings(
                max_examples=75,
                stateful_step_count=40,
                deadline=None,
                suppress_health_check=[HealthCheck.too_slow],
            ),
        )
