"""The run store's commit against a real server: a turn's settlements are all or nothing, and
the next step is queued with the commit or not at all."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence

import pytest

from tests.integration.workers import client_for
from turnstile.jobs.support.scenarios import GOAL, USER
from turnstile.worker.broker.message import StepMessage
from turnstile.worker.runtime.heartbeat import Heartbeat
from turnstile.worker.scheduling import fair
from turnstile.worker.store import keys
from turnstile.worker.store.records import InFlight
from turnstile.worker.store.runs import Change

pytestmark = pytest.mark.integration


def test_a_refused_settlement_leaves_the_other_settlements_and_the_run_unwritten(
    redis_url: str, unique: str
) -> None:
    """A commit settling two holds, the second of which the ledger refuses (settled before
    with another actual), writes nothing: the first hold is still held and the run keeps its
    version."""
    client = client_for(redis_url)
    tenant = f"t-{unique}"
    run_id = client.submit(tenant, USER, "support", GOAL, {}, queue=f"nobody-{unique}")
    client.client.delete(f"nobody-{unique}")  # no worker reads it; the step is not needed
    ledger = client.ledger
    assert ledger.reserve(tenant, "h1", {"cost_microusd": 500}, timeout_s=60).admitted
    assert ledger.reserve(tenant, "h2", {"cost_microusd": 700}, timeout_s=60).admitted
    assert not ledger.settle(tenant, "h2", {"cost_microusd": 100}).replayed
    before = ledger.read(tenant)["cost_microusd"]
    settlements = [
        ledger.settle_script_args(tenant, "h1", {"cost_microusd": 300})[1],
        ledger.settle_script_args(tenant, "h2", {"cost_microusd": 200})[1],
    ]
    change = Change(
        tenant=tenant,
        run_id=run_id,
        version=1,
        old_status="running",
        status="running",
        settlements=settlements,
    )
    committed = client.store.commit(change)
    assert committed.kind == "ledger"
    after = ledger.read(tenant)["cost_microusd"]
    assert (after.committed, after.reserved) == (before.committed, before.reserved) == (100, 500)
    assert client.run_hash(run_id)[1]["version"] == "1"


def test_a_commit_queues_the_next_step_only_if_its_compare_and_set_wins(
    redis_url: str, unique: str
) -> None:
    """With fair share on, the commit that keeps a run running queues its next step in the
    same script: the step is in the tenant's pending list when the commit returns (no crash can
    fall between the two), the slot of the step before is given back, and a stale commit (the
    version moved on) queues nothing."""
    client = client_for(redis_url)
    tenant, queue = f"t-{unique}", f"nobody-{unique}"
    run_id = client.submit(tenant, USER, "support", GOAL, {}, queue=queue)
    # The first step is pending (no worker reads this queue); say it went, with its slot.
    client.client.delete(keys.pending(tenant, queue, "start"), keys.pending_index(tenant))
    client.client.zadd(keys.slots(tenant), {f"{run_id}:1": 2**40})
    following = StepMessage(tenant, run_id, 2, queue)
    change = Change(
        tenant=tenant, run_id=run_id, version=1, old_status="running", status="running",
        next_step=fair.pending_entry(following, 10.0, 12.0),
    )  # fmt: skip
    committed = client.store.commit(change)
    assert (committed.kind, committed.version, committed.queued) == ("ok", 2, True)
    pending = client.client.zrange(keys.pending(tenant, queue, "cont"), 0, -1)
    assert [json.loads(str(e))["version"] for e in pending] == [2]
    assert client.client.hget(keys.pending_index(tenant), run_id) == "2"
    assert client.client.zscore(keys.slots(tenant), f"{run_id}:1") is None
    assert client.client.sismember(keys.fair_active(queue), tenant)

    stale = client.store.commit(change)  # the same change again: version 1 is gone
    assert (stale.kind, stale.queued) == ("stale", False)
    assert client.client.zcard(keys.pending(tenant, queue, "cont")) == 1


@pytest.mark.parametrize("status", ["parked", "suspended", "stopped"])
def test_a_leaving_commit_gives_the_step_slot_back_only_if_it_takes(
    redis_url: str, unique: str, status: str
) -> None:
    """A commit that gives the step's fair-share slot back (`Change.slot`: a run that stops,
    parks or suspends) does so in its own script, and the run's place among the tenant's active runs
    only if the run stops, and wakes the dispatcher in the same round trip; a stale commit
    gives nothing back (the task does, as before)."""
    client = client_for(redis_url)
    tenant, queue = f"t-{unique}", f"nobody-{unique}"
    run_id = client.submit(tenant, USER, "support", GOAL, {}, queue=queue)
    client.client.delete(keys.pending(tenant, queue, "start"), keys.pending_index(tenant))
    client.client.zadd(keys.slots(tenant), {f"{run_id}:1": 2**40, "other:1": 2**40})
    client.client.zadd(keys.active(tenant), {run_id: 1, "other": 1})
    stale = Change(tenant=tenant, run_id=run_id, version=7, old_status="running",
                   status=status, slot=f"{run_id}:7", hold="-")  # fmt: skip
    refused = client.store.commit(stale)
    assert (refused.kind, refused.released) == ("stale", False)
    assert client.client.zscore(keys.slots(tenant), f"{run_id}:1") is not None
    assert client.client.zcard(keys.active(tenant)) == 2

    client.client.delete(keys.FAIR_WAKE)
    change = Change(tenant=tenant, run_id=run_id, version=1, old_status="running",
                    status=status, outcome="completed" if status == "stopped" else "",
                    slot=f"{run_id}:1", hold="-")  # fmt: skip
    committed = client.store.commit(change)
    assert (committed.kind, committed.version, committed.released) == ("ok", 2, True)
    assert client.client.zrange(keys.slots(tenant), 0, -1) == ["other:1"]
    active = client.client.zrange(keys.active(tenant), 0, -1)
    assert sorted(active) == (["other"] if status == "stopped" else sorted([run_id, "other"]))
    assert client.client.lrange(keys.FAIR_WAKE, 0, -1) == ["1"]


def test_a_heartbeat_renews_every_turn_in_flight_in_one_round_trip(
    redis_url: str, unique: str
) -> None:
    """The heartbeat renews the lease of each turn it beats for, all in one call of the
    store's `renew_all` (one pipeline); a turn no longer in flight here is answered False and
    keeps its lease as it was; a turn whose block ended is no longer renewed."""
    client = client_for(redis_url)
    store, tenant, queue = client.store, f"t-{unique}", f"nobody-{unique}"
    runs = [client.submit(tenant, USER, "support", GOAL, {}, queue=queue) for _ in range(3)]
    for run_id in runs[:2]:
        loaded = store.load(
            tenant=tenant, run_id=run_id, version=1, queue=queue, inflight_lease_ms=1_000,
            delivery=f"d-{run_id}",
        )  # fmt: skip
        assert loaded.kind == "go", loaded

    def leases() -> list[float | None]:
        return [client.client.zscore(keys.leases(tenant), run_id) for run_id in runs]

    before = leases()
    turns = [InFlight(tenant, run_id, queue, 60_000) for run_id in runs]
    batches: list[int] = []

    def renew_all(batch: Sequence[InFlight]) -> list[bool]:
        batches.append(len(batch))
        return store.renew_all(batch)

    assert store.renew_all(turns) == [True, True, False]
    renewed = leases()
    for was, now in zip(before[:2], renewed[:2], strict=True):
        assert was is not None and now is not None and now >= was + 59_000
    assert renewed[2] == before[2]  # never loaded: its pickup lease, untouched

    heartbeat: Heartbeat[InFlight] = Heartbeat(0.05, renew_all)
    with heartbeat.beating(turns[0]), heartbeat.beating(turns[1]):
        deadline = time.monotonic() + 10
        while not batches and time.monotonic() < deadline:
            time.sleep(0.01)
    assert batches and batches[0] == 2  # both turns, in one call
    ended = len(batches)
    time.sleep(0.2)
    assert len(batches) <= ended + 1  # nothing left to beat for: no more calls
