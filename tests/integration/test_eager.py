"""Eager continuation (TURNSTILE_EAGER_TURNS): a commit that queues its run's next step may
claim it for its worker, which runs it at once; the claim keeps every guarantee of a queued
step. One prefork worker of one process here, so "who runs next" has one answer to check.

A claimed turn's delivery token ends "+<n>.<nonce>" (its place in its delivery's chain), which
is how these tests tell a claimed turn in flight from a delivered one.
"""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from tests.integration.workers import (
    WorkerProcess,
    client_for,
    ledger_is_the_runs_usage,
    running_workers,
    settled,
    shop_effects,
    wait_until,
)
from turnstile.jobs.support.scenarios import GOAL, USER
from turnstile.worker.client._client import Client
from turnstile.worker.dev.shop import RedisShop
from turnstile.worker.ops import flags
from turnstile.worker.ops.subjects import Subject
from turnstile.worker.store import keys

pytestmark = pytest.mark.integration

# Each turn of the support job's model really sleeps this long (a drill), so a turn in flight
# can be caught and something can happen during it.
TURN_S = 0.6


@pytest.fixture(scope="module")
def queue() -> str:
    return f"eager-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def worker(redis_url: str, queue: str) -> Iterator[WorkerProcess]:
    with running_workers(redis_url, [queue], 1, env={"TURNSTILE_EAGER_TURNS": "8"}) as (w,):
        yield w


@pytest.fixture
def client(redis_url: str, worker: WorkerProcess) -> Iterator[Client]:
    with client_for(redis_url) as client:
        yield client


def _in_flight(client: Client, tenant: str, run_id: str) -> tuple[int, str, int] | None:
    """(version, delivery token, pid) of the run's turn in flight, or None."""
    pipe = client.client.pipeline(transaction=True)
    pipe.hget(keys.run(tenant, run_id), "version")
    pipe.hget(keys.inflight(tenant), run_id)
    version, inflight = pipe.execute()
    if version is None or inflight is None:
        return None
    _queue, pid, _host, token, _lease = str(inflight).split("|")
    return int(str(version)), token, int(pid)


def _claimed_turn_in_flight(client: Client, tenant: str, run_id: str, at_least: int = 2) -> bool:
    here = _in_flight(client, tenant, run_id)
    return here is not None and here[0] >= at_least and "+" in here[1]


def _turn_times(client: Client, tenant: str, run_id: str) -> dict[int, datetime]:
    """When each version of the run was committed by a turn."""
    return {
        int(e["version"]): datetime.fromisoformat(e["at"])
        for _, e in client.store.events(tenant, run_id)
        if e["type"] == "turn"
    }


def test_a_run_chains_its_turns_on_the_worker_that_committed_them(
    client: Client, queue: str, unique: str
) -> None:
    """Alone on the queue, a run's turns after the first are claimed by the commits before
    them: no step of it passes through the pending list, and it ends as it would queued."""
    tenant = f"t-{unique}"
    run_id = client.submit(tenant, USER, "support", GOAL, {"model_sleep_s": TURN_S}, queue=queue)
    wait_until(lambda: _claimed_turn_in_flight(client, tenant, run_id), what="a claimed turn")
    wait_until(lambda: settled(client, [run_id]), what="the run ends")
    assert client.state(run_id).outcome == "completed"
    assert shop_effects(client, run_id) == [
        ["refund", "ord_1001", 3000],
        ["email", "ord_1001"],
    ]
    assert sorted(_turn_times(client, tenant, run_id)) == [2, 3, 4, 5, 6]
    turns = [e for _, e in client.store.events(tenant, run_id) if e["type"] == "turn"]
    assert [bool(e.get("eager")) for e in turns] == [False, True, True, True, True]
    ledger_is_the_runs_usage(client, tenant, [run_id])


def test_a_worker_killed_between_a_claim_and_its_commit_ends_the_run_once(
    client: Client, queue: str, worker: WorkerProcess, unique: str
) -> None:
    """The worker's pool process is SIGKILLed in a claimed turn, after that turn's refund and
    before its commit: the claim's in-flight lease lapses, the sweeper sends the step, the
    turn runs again from the claimed version, the refund replays by its key, and the run ends
    once, completed, with one refund and the ledger exact."""
    tenant = f"t-{unique}"
    run_id = client.submit(
        tenant, USER, "support", GOAL, {"sleep_s": {"issue_refund": 3.0}}, queue=queue
    )
    shop = RedisShop(client.client)
    wait_until(lambda: shop.effects(tenant, run_id) != [], what="the refund is issued")
    here = _in_flight(client, tenant, run_id)
    assert here is not None and "+" in here[1], f"the refund's turn was claimed: {here}"
    os.kill(here[2], signal.SIGKILL)
    wait_until(lambda: settled(client, [run_id]), timeout_s=60, what="the run ends after the kill")
    assert client.state(run_id).outcome == "completed"
    assert shop.effects(tenant, run_id) == [["refund", "ord_1001", 3000], ["email", "ord_1001"]]
    assert shop.orders(tenant, run_id)["ord_1001"].refunded_cents == 3000
    versions = [e["version"] for _, e in client.store.events(tenant, run_id) if e["type"] == "turn"]
    assert versions == list(range(2, 2 + len(versions)))  # one committed turn per version
    finished = [e for _, e in client.store.events(tenant, run_id) if e["type"] == "finished"]
    assert len(finished) == 1
    ledger_is_the_runs_usage(client, tenant, [run_id])


def test_a_pause_during_a_chain_parks_the_run_at_the_next_boundary(
    client: Client, queue: str, unique: str
) -> None:
    """A tenant paused while one of its run's claimed turns runs: that turn commits, its
    commit claims nothing, and the next step parks the run; resumed, it completes."""
    tenant = f"t-{unique}"
    run_id = client.submit(tenant, USER, "support", GOAL, {"model_sleep_s": TURN_S}, queue=queue)
    wait_until(lambda: _claimed_turn_in_flight(client, tenant, run_id), what="a claimed turn")
    here = _in_flight(client, tenant, run_id)
    assert here is not None
    flags.pause(client, Subject(tenant=tenant), by="ops@example.com")
    wait_until(lambda: client.run_hash(run_id)[1]["status"] == "parked", what="the run parks")
    times = _turn_times(client, tenant, run_id)
    # The turn in flight when the pause came committed; no turn ran after it.
    assert max(times) in (here[0] + 1, here[0] + 2), (here, sorted(times))
    parked = [e for _, e in client.store.events(tenant, run_id) if e["type"] == "parked"]
    assert [p["why"] for p in parked] == ["tenant paused"]
    flags.resume(client, Subject(tenant=tenant), by="ops@example.com")
    wait_until(lambda: settled(client, [run_id]), what="the resumed run ends")
    assert client.state(run_id).outcome == "completed"
    ledger_is_the_runs_usage(client, tenant, [run_id])


def test_another_tenants_run_gets_its_turn_within_one_turn_of_a_chain(
    client: Client, queue: str, unique: str
) -> None:
    """Tenant A's run is chaining on the only worker when tenant B submits: the commit of A's
    turn in flight sees B waiting and queues A's next step instead of claiming it, so B's
    first turn runs before A's next one."""
    a, b = f"a-{unique}", f"b-{unique}"
    run_a = client.submit(a, USER, "support", GOAL, {"model_sleep_s": TURN_S}, queue=queue)
    wait_until(lambda: _claimed_turn_in_flight(client, a, run_a), what="A's run chains")
    run_b = client.submit(b, USER, "support", GOAL, {"model_sleep_s": TURN_S}, queue=queue)
    queued = datetime.now(UTC)  # B's first step is in its pending list
    wait_until(lambda: settled(client, [run_a, run_b]), what="both runs end")
    times_a, times_b = _turn_times(client, a, run_a), _turn_times(client, b, run_b)
    # The first of A's turns to end after B's step was queued is the one that was in flight
    # (its commit sees B waiting and queues A's next step); the next one comes only after B's
    # first turn.
    after = sorted(t for t in times_a.values() if t > queued)
    assert len(after) >= 2, (queued, sorted(times_a.items()))
    assert times_b[2] < after[1], (queued, sorted(times_a.items()), sorted(times_b.items()))
    assert client.state(run_a).outcome == client.state(run_b).outcome == "completed"


@pytest.mark.slow  # over 14 s on 2 cores: CI runs it in the slow part
def test_a_worker_told_to_stop_ends_its_chain_at_the_turn_in_flight(
    redis_url: str, unique: str
) -> None:
    """SIGTERM to a worker whose run is chaining: the turn in flight commits and queues the
    run's next step instead of claiming it, so the warm shutdown waits for one turn; the step
    waits in the tenant's pending list, and another worker finishes the run."""
    queue, tenant = f"stop-{unique}", f"t-{unique}"
    with client_for(redis_url) as client:
        _stop_mid_chain(client, redis_url, queue, tenant)


def _stop_mid_chain(client: Client, redis_url: str, queue: str, tenant: str) -> None:
    with running_workers(redis_url, [queue], 1, prefix="stopping") as (stopping,):
        run_id = client.submit(
            tenant, USER, "support", GOAL, {"model_sleep_s": 2 * TURN_S}, queue=queue
        )
        wait_until(lambda: _claimed_turn_in_flight(client, tenant, run_id), what="a chain")
        here = _in_flight(client, tenant, run_id)
        assert here is not None
        stopping.terminate()
        stopping.wait_stopped(30)
    stored = client.run_hash(run_id)[1]
    assert stored["status"] == "running", stored
    # The turn in flight committed (and no later one ran); its next step waits, queued: in
    # the tenant's pending list, or taken from it and sent to the broker by the dispatcher.
    assert int(stored["version"]) == here[0] + 1, (here, stored["version"])
    pending = client.client.hget(keys.pending_index(tenant), run_id)
    sent = client.client.zscore(keys.fair_sent(queue), f"{tenant}|{run_id}:{stored['version']}")
    assert pending == stored["version"] or sent is not None, (pending, sent)
    with running_workers(redis_url, [queue], 1, prefix="finishing"):
        wait_until(lambda: settled(client, [run_id]), what="another worker ends the run")
    assert client.state(run_id).outcome == "completed"
    ledger_is_the_runs_usage(client, tenant, [run_id])
