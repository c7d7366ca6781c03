"""Operator controls with real Celery worker processes on a real server: a tenant paused with
50 runs in flight, a queue drained and its workers killed, resumes that race, a queue pause
meeting a tenant pause."""

from __future__ import annotations

import json
import threading
import time
from contextlib import AbstractContextManager
from typing import Any

import pytest
from typer.testing import CliRunner

from tests.integration.rabbitmq import BROKERS, broker_for
from tests.integration.workers import (
    WorkerProcess,
    client_for,
    ended_once,
    expected_rows,
    running_workers,
    settled,
    shop_effects,
    stored_row,
    wait_until,
)
from turnstile.errors import SubmissionError
from turnstile.jobs.support.scenarios import BY_LETTER, GOAL, USER
from turnstile.worker.broker import layout
from turnstile.worker.cli.main import app
from turnstile.worker.client._client import Client
from turnstile.worker.ops import flags, queues, subjects
from turnstile.worker.ops.subjects import Subject
from turnstile.worker.store import keys

pytestmark = pytest.mark.integration

runner = CliRunner()

# Real slowness in the tools, so turns are in flight when a control lands.
SLOW = {"sleep_s": {"get_order": 0.4, "send_status_email": 0.4}}
MIXED = "ABCEFH"  # scenarios that end on their own (G waits for a person)


def workers(
    redis_url: str, queue: str, count: int, concurrency: int, broker_url: str | None = None
) -> AbstractContextManager[list[WorkerProcess]]:
    """`count` worker processes with `concurrency` pool processes each, on `queue`."""
    return running_workers(
        redis_url, [queue], count, prefix="c", concurrency=concurrency, stop_timeout_s=15,
        broker_url=broker_url,
    )  # fmt: skip


def _kinds(client: Client, tenant: str, run_id: str) -> list[str]:
    return [e["type"] for _, e in client.store.events(tenant, run_id)]


def _turns(client: Client, tenant: str, run_ids: list[str]) -> int:
    return sum(_kinds(client, tenant, r).count("turn") for r in run_ids)


def _ledger(client: Client, tenant: str) -> dict[str, tuple[int, int]]:
    return {d: (s.committed, s.reserved) for d, s in client.ledger.read(tenant).items()}


def _status(client: Client, run_id: str) -> str:
    return client.run_hash(run_id)[1]["status"]


@pytest.mark.slow  # over 14 s on 2 cores: CI runs it in the slow part
@pytest.mark.parametrize("broker", BROKERS)
def test_a_paused_tenant_stops_at_the_next_boundary_and_resumes_exactly_once(
    redis_url: str, unique: str, broker: str
) -> None:
    """50 runs of one tenant in flight on two workers (six pool processes) when the tenant is
    paused: once every turn that was running has committed, no turn of that tenant starts and
    its ledger stops moving, while another tenant's runs all finish. Resumed, every one of the
    50 finishes exactly once with the outcome, numbers and effects it has without a pause.
    On the store's Redis as the broker and on RabbitMQ: the pause is the store's gate."""
    queue, paused, other = f"pause-{unique}", f"p-{unique}", f"o-{unique}"
    with broker_for(broker, redis_url, queue) as (store, broker_url):
        pause_then_resume(store, broker_url, queue, paused, other)


def pause_then_resume(
    store: str, broker_url: str | None, queue: str, paused: str, other: str
) -> None:
    """The pause test's body, on a store and a broker (None: the store's own server)."""
    with workers(store, queue, count=2, concurrency=3, broker_url=broker_url):
        client = client_for(store, broker_url)
        letters = [MIXED[i % len(MIXED)] for i in range(50)]
        ids: list[str] = []
        others: list[str] = []
        for i, letter in enumerate(letters):
            s = BY_LETTER[letter]
            ids.append(client.submit(paused, USER, "support", GOAL, {**s.params, **SLOW},
                                     budget=s.budget, queue=queue))  # fmt: skip
            if i % 4 == 0:
                others.append(client.submit(other, USER, "support", GOAL, SLOW, queue=queue))
        wait_until(lambda: _turns(client, paused, ids) >= 10, what="the tenant's runs start")
        assert subjects.live_inflight(client, Subject(tenant=paused)), "turns are in flight"
        flags.pause(client, Subject(tenant=paused), by="ops@example.com")

        # The pause is seen once every turn that was running when it landed has committed.
        wait_until(lambda: not subjects.live_inflight(client, Subject(tenant=paused)),
                   timeout_s=30, what="the turns in flight finish")  # fmt: skip
        turns, ledger = _turns(client, paused, ids), _ledger(client, paused)
        wait_until(lambda: settled(client, others), timeout_s=60, what="the other tenant ends")
        wait_until(
            lambda: all(_status(client, r) in ("parked", "stopped") for r in ids),
            what="every run of the paused tenant is parked or ended",
        )
        time.sleep(1.0)  # a worker that ignored the pause would have started a turn by now
        assert _turns(client, paused, ids) == turns
        assert _ledger(client, paused) == ledger
        assert {client.state(r).outcome for r in others} == {"completed"}
        parked = [r for r in ids if _status(client, r) == "parked"]
        assert len(parked) >= 20, "most runs were caught by the pause"
        assert any(client.state(r).usage.steps > 0 for r in parked), "some mid-run"

        done = flags.resume(client, Subject(tenant=paused), by="ops@example.com")
        assert sorted(done.resumed) == sorted(parked) and done.still_parked == 0
        wait_until(lambda: settled(client, ids), timeout_s=90, what="the 50 runs end")
    expected = expected_rows()
    for letter, run_id in zip(letters, ids, strict=True):
        assert stored_row(client, run_id) == expected[letter], (letter, run_id)
        ended_once(client, paused, run_id)
        kinds = _kinds(client, paused, run_id)
        assert kinds.count("resumed") == (1 if run_id in parked else 0)
        assert kinds.count("parked") == (1 if run_id in parked else 0)


@pytest.mark.slow  # over 14 s on 2 cores: CI runs it in the slow part
@pytest.mark.parametrize("broker", BROKERS)
def test_drain_wait_returns_when_nothing_is_in_flight_and_killing_workers_loses_nothing(
    redis_url: str, unique: str, broker: str
) -> None:
    """`drain --wait` refuses new submissions and returns only when no turn of the queue is in
    flight; the turns that were running finish and their runs park. Every worker is then
    killed: nothing is lost, and new workers plus `resume` finish every run exactly once. On
    the store's Redis as the broker and on RabbitMQ (whose queue the views read by AMQP)."""
    queue, tenant = f"drain-{unique}", f"t-{unique}"
    with broker_for(broker, redis_url, queue) as (store, broker_url):
        drain_kill_resume(store, broker_url, queue, tenant)


def drain_kill_resume(redis_url: str, broker_url: str | None, queue: str, tenant: str) -> None:
    """The drain test's body, on a store and a broker (None: the store's own server)."""
    env = {"TURNSTILE_REDIS_URL": redis_url, "TURNSTILE_BROKER_URL": broker_url or redis_url}
    slow = {"sleep_s": {"get_order": 1.0, "send_status_email": 1.0}}
    with workers(redis_url, queue, count=2, concurrency=2, broker_url=broker_url) as first:
        client = client_for(redis_url, broker_url)
        ids = [client.submit(tenant, USER, "support", GOAL, slow, queue=queue) for _ in range(12)]
        subject = Subject(queue=queue)
        wait_until(lambda: len(subjects.live_inflight(client, subject)) >= 2, what="turns run")
        loaded = _loaded_versions(client, tenant, subjects.live_inflight(client, subject))
        assert loaded, "turns are in flight when the drain starts"
        result = runner.invoke(app, ["drain", "--queue", queue, "--wait", "--json"], env=env)
        assert result.exit_code == 0, result.output
        # At the moment it returned nothing was in flight. (A step still queued may load a
        # moment later, only to park: its in-flight mark lives for that moment.)
        drained = json.loads(result.stdout)
        assert drained["queue"]["in_flight"] == 0 and drained["drain"]["flag"] == "draining"
        with pytest.raises(SubmissionError, match="draining"):
            client.submit(tenant, USER, "support", GOAL, {}, queue=queue)
        for run_id, version in loaded.items():  # the turn in flight was finished and committed
            turns = [e["version"] for _, e in client.store.events(tenant, run_id)
                     if e["type"] == "turn"]  # fmt: skip
            assert version + 1 in turns, (run_id, version, turns)
        # The queued steps are delivered and park; then the workers are killed outright.
        wait_until(lambda: all(_status(client, r) in ("parked", "stopped") for r in ids),
                   what="every queued step parks")  # fmt: skip
        assert subjects.live_inflight(client, subject) == []
        for worker in first:
            worker.kill()
    for run_id in ids:  # nothing is lost: parked, ended, or live with a lease the sweeper sees
        stored = client.run_hash(run_id)[1]
        leased = client.client.zscore(keys.leases(tenant), run_id) is not None
        assert stored["status"] in ("parked", "stopped") or leased, (run_id, stored["status"])
    assert any(_status(client, r) == "parked" for r in ids)
    with workers(redis_url, queue, count=2, concurrency=2, broker_url=broker_url):
        result = runner.invoke(app, ["resume", "--queue", queue], env=env)
        assert result.exit_code == 0, result.output
        wait_until(lambda: settled(client, ids), timeout_s=90, what="every run ends")
    for run_id in ids:
        assert client.state(run_id).outcome == "completed", client.run_hash(run_id)[1]["reason"]
        assert shop_effects(client, run_id) == [
            ["refund", "ord_1001", 3000], ["email", "ord_1001"],
        ]  # fmt: skip
        ended_once(client, tenant, run_id)


def _loaded_versions(
    client: Client, tenant: str, inflight: list[tuple[str, str, str]]
) -> dict[str, int]:
    """The version each in-flight turn loaded, read atomically with its in-flight entry: a
    turn still in flight has not committed, so the run's version is the one it loaded."""
    pipe = client.client.pipeline(transaction=True)
    for _, run_id, _ in inflight:
        pipe.hexists(keys.inflight(tenant), run_id)
        pipe.hget(keys.run(tenant, run_id), "version")
    replies = pipe.execute()
    return {
        run_id: int(replies[2 * i + 1])
        for i, (_, run_id, _) in enumerate(inflight)
        if replies[2 * i]
    }


def test_racing_resumes_send_each_parked_run_once(redis_url: str, unique: str) -> None:
    """Four resumes at once: one clears the pause, the others find nothing to clear and change
    nothing, and each parked run is re-enqueued once. Four callers re-enqueueing the same
    parked runs at once: the version compare-and-set lets one of them send each run's step.
    (Its clients send straight to the broker, TURNSTILE_FAIR_SHARE=0, so every message sent is
    counted there: a tenant's pending list would fold a second copy into the first.)"""
    queue, tenant = f"race-{unique}", f"t-{unique}"
    client = client_for(redis_url, fair_share=False)
    subject = Subject(tenant=tenant)

    def park_all(ids: list[str]) -> None:
        with workers(redis_url, queue, count=1, concurrency=2):
            wait_until(lambda: all(_status(client, r) == "parked" for r in ids), what="parked")

    ids = [client.submit(tenant, USER, "support", GOAL, {}, queue=queue) for _ in range(8)]
    flags.pause(client, subject, by="a")
    park_all(ids)
    outcomes: list[Any] = []

    def resume(i: int, barrier: threading.Barrier) -> None:
        barrier.wait()
        outcomes.append(flags.resume(client_for(redis_url, fair_share=False), subject, by=f"op{i}"))

    barrier = threading.Barrier(4)
    threads = [threading.Thread(target=resume, args=(i, barrier)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    won = [o for o in outcomes if o.cleared]
    assert len(won) == 1 and sorted(won[0].resumed) == sorted(ids)
    assert all(o.resumed == [] for o in outcomes if not o.cleared)
    assert layout.broker_depth(redis_url, queue) == len(ids)
    for run_id in ids:
        assert _kinds(client, tenant, run_id).count("resumed") == 1

    flags.pause(client, subject, by="a")
    park_all(ids)  # the steps just sent are consumed and park the runs again
    assert layout.broker_depth(redis_url, queue) == 0
    sent: list[str] = []

    def requeue_all(barrier: threading.Barrier) -> None:
        c = client_for(redis_url, fair_share=False)
        barrier.wait()
        for run_id in ids:
            sent.append(flags.requeue(c, tenant, run_id, by="racer", at="now"))

    barrier = threading.Barrier(4)
    threads = [threading.Thread(target=requeue_all, args=(barrier,)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sent.count("sent") == len(ids) and sent.count("skipped") == 3 * len(ids)
    assert layout.broker_depth(redis_url, queue) == len(ids)
    for run_id in ids:
        assert _kinds(client, tenant, run_id).count("resumed") == 2
        client.store.fail_run(tenant, run_id, "the test is over")  # no sweeper re-sends it
    client.client.delete(queue)


def test_a_queue_pause_and_a_tenant_pause_each_hold_their_runs(redis_url: str, unique: str) -> None:
    """Runs of two tenants on a paused queue park. Resuming the queue re-enqueues the runs of
    the tenant that is not paused and leaves the paused tenant's runs parked; resuming that
    tenant brings them back. `queues` shows the parked count and the flag."""
    queue, t1, t2 = f"qp-{unique}", f"a-{unique}", f"b-{unique}"
    client = client_for(redis_url)
    first = client.submit(t1, USER, "support", GOAL, {}, queue=queue)  # makes the queue known
    second = client.submit(t2, USER, "support", GOAL, {}, queue=queue)
    flags.pause(client, Subject(queue=queue), by="ops")
    flags.pause(client, Subject(tenant=t2), by="ops")
    ids = [first, second] + [
        client.submit(t, USER, "support", GOAL, {}, queue=queue) for t in (t1, t2) for _ in range(2)
    ]
    with workers(redis_url, queue, count=1, concurrency=2):
        wait_until(lambda: all(_status(client, r) == "parked" for r in ids), what="all park")
        view = queues.queue_view(client, queue)
        assert (view.parked, view.in_flight, view.depth) == (6, 0, 0)
        assert view.paused and view.paused_by == "ops"
        done = flags.resume(client, Subject(queue=queue), by="ops")
        assert len(done.resumed) == 3 and done.still_parked == 3
        mine = [r for r in ids if client.tenant_of(r) == t1]
        wait_until(lambda: settled(client, mine), what="the first tenant's runs end")
        assert all(_status(client, r) == "parked" for r in ids if r not in mine)
        done = flags.resume(client, Subject(tenant=t2), by="ops")
        assert len(done.resumed) == 3
        wait_until(lambda: settled(client, ids), what="every run ends")
    assert {client.state(r).outcome for r in ids} == {"completed"}


def test_a_tenant_named_like_a_queues_flag_does_not_open_that_queue(
    redis_url: str, unique: str
) -> None:
    """A tenant named `queue:<Q>` is not mistaken for queue Q's flags: resuming that tenant
    leaves its runs on the paused queue Q parked, held back by the queue's pause."""
    queue = f"qn-{unique}"
    tenant = f"queue:{queue}"
    client = client_for(redis_url)
    ids = [client.submit(tenant, USER, "support", GOAL, {}, queue=queue)]  # the queue is known
    flags.pause(client, Subject(queue=queue), by="ops")
    flags.pause(client, Subject(tenant=tenant), by="ops")
    ids.append(client.submit(tenant, USER, "support", GOAL, {}, queue=queue))
    with workers(redis_url, queue, count=1, concurrency=1):
        wait_until(lambda: all(_status(client, r) == "parked" for r in ids), what="both park")
    done = flags.resume(client, Subject(tenant=tenant), by="ops")
    assert done.cleared == ["paused"] and done.resumed == [] and done.still_parked == len(ids)
    assert all(_status(client, r) == "parked" for r in ids)
    for run_id in ids:
        client.store.fail_run(tenant, run_id, "the test is over")
