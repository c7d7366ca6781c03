"""The step worker with real Celery worker processes on a real server: the reference scenarios
through the queue, approval, and the failure table of docs/concepts.md, one test per row."""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest
import redis

from tests.integration.workers import (
    WorkerProcess,
    client_for,
    expected_rows,
    ledger_is_the_runs_usage,
    running_workers,
    settled,
    shop_effects,
    stored_row,
    wait_until,
)
from turnstile.errors import SubmissionConflictError, SubmissionError
from turnstile.jobs.budget import Budget
from turnstile.jobs.support.scenarios import BY_LETTER, GOAL, SCENARIOS, USER
from turnstile.worker.broker import layout
from turnstile.worker.broker.message import STEP_TASK
from turnstile.worker.broker.producer import producer
from turnstile.worker.client._client import Client
from turnstile.worker.dev.embedded import EmbeddedServer
from turnstile.worker.dev.shop import RedisShop
from turnstile.worker.ops import flags
from turnstile.worker.ops.subjects import Subject
from turnstile.worker.settings import Settings
from turnstile.worker.store import keys

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def queue() -> str:
    return f"q-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module", params=["prefork", "gevent"])
def worker_pool(request: pytest.FixtureRequest) -> str:
    """Every test of the failure table runs on both pools: a process per turn, and many
    turns as greenlets in one process."""
    return str(request.param)


@pytest.fixture(scope="module")
def pool(redis_url: str, queue: str, worker_pool: str) -> Iterator[list[WorkerProcess]]:
    with running_workers(redis_url, [queue], 2, pool=worker_pool) as workers:
        yield workers


@pytest.fixture
def client(redis_url: str, pool: list[WorkerProcess]) -> Client:
    return client_for(redis_url)


def _submit_all(client: Client, tenant: str, queue: str, **params: Any) -> dict[str, str]:
    return {
        s.letter: client.submit(
            tenant, USER, "support", GOAL, {**s.params, **params}, budget=s.budget, queue=queue
        )
        for s in SCENARIOS
    }


def test_scenarios_through_the_queue_match_in_process(
    client: Client, queue: str, pool: list[WorkerProcess], unique: str
) -> None:
    """A-H through the queue on two worker processes end with the same outcomes, numbers and
    effects as in process; each run's last log line carries its tenant, run id and step."""
    tenant = f"t-{unique}"
    ids = _submit_all(client, tenant, queue)
    wait_until(lambda: settled(client, list(ids.values())), timeout_s=60, what="scenarios settle")
    expected = expected_rows()
    for letter, run_id in ids.items():
        assert stored_row(client, run_id) == expected[letter], letter
    finished = {
        e["run_id"]: e for w in pool for e in w.events("run_finished") if e.get("tenant") == tenant
    }
    for letter, run_id in ids.items():
        if letter == "G":  # suspended for approval: its last line is run_suspended
            continue
        line, steps = finished[run_id], client.state(run_id).usage.steps
        # The step the task worked on: the last counted one, or the next when admission refused
        # it; the version it loaded, which its commit moved on by one.
        assert line["step"] in (steps, steps + 1), letter
        assert line["version"] + 1 == _versions(client, tenant, run_id)[-1], letter
        assert line["outcome"] == expected[letter]["outcome"], letter


def test_approving_a_suspended_run_resumes_it(client: Client, queue: str, unique: str) -> None:
    """G suspends with the refund held; approved, it completes with one refund and one email,
    and the decision is in the run's events with who made it."""
    g = BY_LETTER["G"]
    run_id = client.submit(f"t-{unique}", USER, "support", GOAL, g.params, queue=queue)
    wait_until(lambda: settled(client, [run_id]), what="G suspends")
    held = client.state(run_id).pending
    assert held is not None and held.call.name == "issue_refund"
    client.approve(run_id, by="ops@example.com", digest=held.digest)
    wait_until(lambda: client.run_hash(run_id)[1]["status"] == "stopped", what="G completes")
    state = client.state(run_id)
    assert (state.outcome, state.usage.steps, state.usage.tool_calls, state.usage.tokens) == (
        "completed",
        5,
        4,
        708,
    )
    assert state.usage.elapsed_ms == 11_200
    assert shop_effects(client, run_id) == [
        ["refund", "ord_1004", 8000],
        ["email", "ord_1004"],
    ]
    decisions = [
        e for _, e in client.store.events(f"t-{unique}", run_id) if e["type"] == "decision"
    ]
    assert decisions[0]["kind"] == "approved" and decisions[0]["by"] == "ops@example.com"


def _versions(client: Client, tenant: str, run_id: str) -> list[int]:
    return [e["version"] for _, e in client.store.events(tenant, run_id) if e["type"] == "turn"]


def test_sigkill_in_the_middle_of_a_turn_does_not_refund_twice(
    client: Client, queue: str, pool: list[WorkerProcess], unique: str
) -> None:
    """A worker process killed after the refund and before the commit: the message comes back
    (acks late, reject on worker lost), the turn runs again from the old version, the refund
    replays by its key, and the run ends once, completed, with one refund."""
    sigkill_after_the_refund(client, queue, f"t-{unique}")


def sigkill_after_the_refund(client: Client, queue: str, tenant: str) -> None:
    """SIGKILL the pool process running a turn after its refund, before its commit: the run
    still ends once, completed, with one refund, one turn per version, and the ledger exact."""
    run_id = client.submit(
        tenant, USER, "support", GOAL, {"sleep_s": {"issue_refund": 3.0}}, queue=queue
    )
    shop = RedisShop(client.client)
    wait_until(lambda: shop.effects(tenant, run_id) != [], what="the refund is issued")
    inflight = client.client.hget(keys.inflight(tenant), run_id)
    assert inflight is not None
    pid = int(str(inflight).split("|")[1])
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: settled(client, [run_id]), timeout_s=60, what="the run ends after the kill")
    state = client.state(run_id)
    assert state.outcome == "completed"
    assert shop.effects(tenant, run_id) == [["refund", "ord_1001", 3000], ["email", "ord_1001"]]
    versions = _versions(client, tenant, run_id)
    assert versions == list(range(2, 2 + len(versions)))  # one committed turn per version
    assert shop.orders(tenant, run_id)["ord_1001"].refunded_cents == 3000
    ledger_is_the_runs_usage(client, tenant, [run_id])


@pytest.mark.slow  # over 14 s on 2 cores: CI runs it in the slow part
def test_a_step_that_keeps_killing_its_worker_ends_the_run_error(
    client: Client, queue: str, unique: str
) -> None:
    """A turn that kills its worker process every time is stopped after the attempt limit;
    another run on the same workers is not affected."""
    tenant = f"t-{unique}"
    poison = client.submit(tenant, USER, "support", GOAL, {"die_in": "get_order"}, queue=queue)
    healthy = client.submit(tenant, USER, "support", GOAL, {}, queue=queue)
    wait_until(lambda: settled(client, [poison, healthy]), timeout_s=90, what="both runs end")
    stored = client.run_hash(poison)[1]
    assert (stored["outcome"], stored["status"]) == ("error", "stopped")
    assert "keeps killing the worker" in stored["reason"]
    (finished,) = _finished(client, tenant, poison)  # ended by the limit, closed like any run
    assert finished["message"].startswith("Something went wrong on our side"), finished
    ledger_is_the_runs_usage(client, tenant, [poison, healthy])
    assert client.state(healthy).outcome == "completed"


def test_the_tenant_cap_holds_across_workers(client: Client, queue: str, unique: str) -> None:
    """100 runs of one tenant on two worker processes under a cost ceiling that admits about
    half: committed never passes the ceiling; the rest end budget_exhausted naming the
    tenant's dimension; the ledger's committed cost is exactly what the runs spent."""
    tenant = f"cap-{unique}"
    ceiling = 200_000
    client.ledger.set_ceiling(tenant, "cost_microusd", ceiling)
    budget = Budget(max_cost_microusd=50_000)
    runs = [
        client.submit(
            tenant, USER, "support", GOAL, {"model_latency_s": 0}, budget=budget, queue=queue
        )
        for _ in range(100)
    ]
    peak = 0

    def done() -> bool:
        nonlocal peak
        figures = client.ledger.read(tenant)["cost_microusd"]
        peak = max(peak, figures.committed + figures.reserved)
        return settled(client, runs)

    wait_until(done, timeout_s=120, every_s=0.02, what="100 runs end")
    figures = client.ledger.read(tenant)["cost_microusd"]
    assert peak <= ceiling and figures.committed <= ceiling and figures.reserved == 0
    states = [client.state(r) for r in runs]
    outcomes = {(s.outcome, s.detail) for s in states}
    assert outcomes <= {("completed", None), ("budget_exhausted", "tenant.cost_microusd")}
    completed = sum(s.outcome == "completed" for s in states)
    assert 20 <= completed <= 70
    assert figures.committed == sum(s.usage.cost_microusd for s in states)


def test_malformed_messages_are_logged_acked_and_fail_only_their_run(
    client: Client, queue: str, pool: list[WorkerProcess], unique: str, redis_url: str
) -> None:
    """A message with bad arguments ends its run `error`; one for an unknown run and one whose
    body is not even JSON are logged and dropped; a run alongside finishes normally."""
    tenant = f"t-{unique}"
    victim = client.submit(
        tenant,
        USER,
        "support",
        GOAL,
        {"model": "same_call", "sleep_s": {"get_order": 0.3}},  # alive for ~15 s
        budget=Budget(
            max_steps=50, max_repeat=50, max_stalls=50, max_tool_calls=50, deadline_ms=600_000
        ),
        queue=queue,
    )
    healthy = client.submit(tenant, USER, "support", GOAL, {}, queue=queue)
    producer(Settings(redis_url=redis_url)).send_task(
        STEP_TASK,
        kwargs={"tenant": tenant, "run_id": victim, "version": "seven", "queue": queue},
        queue=queue,
    )
    producer(Settings(redis_url=redis_url)).send_task(
        STEP_TASK,
        kwargs={"tenant": tenant, "run_id": "run_nobody", "version": 1, "queue": queue},
        queue=queue,
    )
    client.client.lpush(layout.broker_queue(queue), b"\x00\x01 this is not a message")
    wait_until(lambda: settled(client, [victim, healthy]), timeout_s=60, what="runs end")
    stored = client.run_hash(victim)[1]
    assert stored["outcome"] == "error" and "malformed step message" in stored["reason"]
    assert client.state(healthy).outcome == "completed"
    # The message for an unknown run may be taken after both runs have ended: wait for its line.
    said = ("malformed_step_message", "step_skipped")
    wait_until(lambda: all(word in "".join(w.log() for w in pool) for word in said),
               timeout_s=30, what="the worker to log both messages")  # fmt: skip


def test_a_state_that_does_not_parse_ends_the_run_error(
    client: Client, queue: str, unique: str, redis_url: str
) -> None:
    """A delivery that finds a state it cannot read (here: an unknown schema version) ends the
    run `error` with the reason, and nothing else."""
    tenant = f"t-{unique}"
    run_id = client.submit(tenant, USER, "support", GOAL, BY_LETTER["G"].params, queue=queue)
    wait_until(lambda: settled(client, [run_id]), what="G suspends, its state at rest")
    stored = client.run_hash(run_id)[1]
    raw = msgspec.json.decode(stored["state"])
    raw["schema_version"] = 42
    run_key = keys.run(tenant, run_id)
    client.client.hset(run_key, mapping={"state": msgspec.json.encode(raw), "status": "running"})
    producer(Settings(redis_url=redis_url)).send_task(STEP_TASK, queue=queue, kwargs={
        "tenant": tenant, "run_id": run_id, "version": int(stored["version"]), "queue": queue,
    })  # fmt: skip
    wait_until(lambda: client.run_hash(run_id)[1]["status"] == "stopped", what="the run ends")
    stored = client.run_hash(run_id)[1]
    assert stored["outcome"] == "error" and "schema version 42" in stored["reason"]


def scenarios_end_as_in_process(
    redis_url: str,
    queue: str,
    tenant: str,
    env: dict[str, str],
    worker_pool: str,
    *,
    broker_url: str | None = None,
) -> list[WorkerProcess]:
    """Run A-H through workers started with `env` (on `broker_url`, the store's server by
    default); every run must end as it does in process, with one committed turn per version.
    Returns the workers, stopped, for their logs."""
    with running_workers(
        redis_url, [queue], 2, env=env, pool=worker_pool, broker_url=broker_url
    ) as workers:
        client = client_for(redis_url, broker_url)
        ids = _submit_all(client, tenant, queue)
        wait_until(
            lambda: settled(client, list(ids.values())), timeout_s=120, what="scenarios settle"
        )
        expected = expected_rows()
        for letter, run_id in ids.items():
            assert stored_row(client, run_id) == expected[letter], letter
            versions = _versions(client, tenant, run_id)
            assert versions == list(range(2, 2 + len(versions)))
    return workers


@pytest.mark.slow  # over 10 s on 2 cores: CI runs it in the slow part
def test_every_message_delivered_twice_gives_the_same_results(
    redis_url: str, unique: str, worker_pool: str
) -> None:
    """With every step message sent twice, two workers get each step; one turn runs per
    version, so final states and effects are those of a single delivery."""
    scenarios_end_as_in_process(
        redis_url, f"dup-{unique}", f"t-{unique}", {"TURNSTILE_CHAOS_SEND_COPIES": "2"}, worker_pool
    )


@pytest.mark.slow  # over 10 s on 2 cores: CI runs it in the slow part
def test_a_crash_after_commit_before_enqueue_is_finished_by_the_sweeper(
    redis_url: str, unique: str, worker_pool: str
) -> None:
    """Every second send is dropped, as if the worker died between its commit and its
    enqueue: the sweeper finds the lapsed leases and every run still ends as in process."""
    env = {"TURNSTILE_CHAOS_DROP_EVERY": "2", "TURNSTILE_PICKUP_LEASE_S": "1"}
    workers = scenarios_end_as_in_process(
        redis_url, f"drop-{unique}", f"t-{unique}", env, worker_pool
    )
    # Sends were dropped, and only a sweeper (any worker's: one holds the lock at a time)
    # could have sent those steps again.
    assert sum(len(w.events("chaos_send_dropped")) for w in workers) > 0


@pytest.mark.slow  # over 10 s on 2 cores: CI runs it in the slow part
def test_store_and_ledger_down_no_turn_runs_and_runs_continue_after(
    unique: str, worker_pool: str
) -> None:
    """The store (which holds the ledger) stops while runs are under way: steps retry, no turn
    runs, nothing is admitted; when the server is back every run finishes."""
    with EmbeddedServer() as broker, EmbeddedServer(appendonly=True) as store:
        store_down_then_back(store, broker.url, f"down-{unique}", f"t-{unique}", worker_pool)


def store_down_then_back(
    store: EmbeddedServer, broker_url: str, queue: str, tenant: str, worker_pool: str
) -> None:
    """Runs under way when the store stops: steps retry (a countdown on the broker), and
    every run finishes once the store is back, with nothing left reserved."""
    with running_workers(store.url, [queue], 2, broker_url=broker_url, pool=worker_pool) as workers:
        client = client_for(store.url, broker_url=broker_url)
        runs = [
            client.submit(
                tenant, USER, "support", GOAL, {"sleep_s": {"get_order": 0.5}}, queue=queue
            )
            for _ in range(4)
        ]
        # Stop the store once turns are under way (a turn is in flight, its tool sleeping),
        # and start it again once the workers have seen it gone (a step retried).
        wait_until(
            lambda: client.client.hlen(keys.inflight(tenant)) > 0, what="a turn is in flight"
        )
        store.stop()
        wait_until(
            lambda: sum(len(w.events("step_retry")) for w in workers) > 0,
            timeout_s=30, what="a step retries while the store is down",
        )  # fmt: skip
        store.start()
        client = client_for(store.url, broker_url=broker_url)
        wait_until(lambda: settled(client, runs), timeout_s=90, what="runs finish after the outage")
        assert {client.state(r).outcome for r in runs} == {"completed"}
        shop = RedisShop(client.client)
        for run_id in runs:
            assert shop.effects(tenant, run_id) == [
                ["refund", "ord_1001", 3000], ["email", "ord_1001"],
            ]  # fmt: skip
        assert client.ledger.read(tenant)["cost_microusd"].reserved == 0


@pytest.mark.slow  # over 14 s on 2 cores: CI runs it in the slow part
def test_a_hung_model_is_stopped_from_outside(
    redis_url: str, unique: str, worker_pool: str
) -> None:
    """A model call that ignores its timeout is stopped by the step's time limit: the run ends
    budget_exhausted at its deadline instead of hanging."""
    queue = f"hang-{unique}"
    env = {"TURNSTILE_STEP_GRACE_S": "2", "TURNSTILE_SOFT_MARGIN_S": "1"}
    with running_workers(redis_url, [queue], 1, env=env, pool=worker_pool):
        client = client_for(redis_url)
        run_id = client.submit(f"t-{unique}", USER, "support", GOAL, {"model_sleep_s": 60},
                               budget=Budget(deadline_ms=1000), queue=queue)  # fmt: skip
        started = time.monotonic()
        wait_until(lambda: settled(client, [run_id]), timeout_s=30, what="the hung run ends")
        assert time.monotonic() - started < 15
        state = client.state(run_id)
        assert (state.outcome, state.detail) == ("budget_exhausted", "deadline")


def test_submission_is_idempotent_and_checked(client: Client, queue: str, unique: str) -> None:
    tenant = f"t-{unique}"
    run_id = client.submit(tenant, USER, "support", GOAL, {}, queue=queue, run_id=f"r-{unique}")
    assert (
        client.submit(tenant, USER, "support", GOAL, {}, queue=queue, run_id=f"r-{unique}")
        == run_id
    )
    with pytest.raises(SubmissionConflictError):
        client.submit(
            tenant, USER, "support", "another goal", {}, queue=queue, run_id=f"r-{unique}"
        )
    bad: list[dict[str, Any]] = [
        {"job": "nope"}, {"tenant": ""}, {"user": ""}, {"goal": "x" * 5000},
        {"params": {"blob": "x" * 20_000}}, {"queue": "bad queue!"},
        {"budget": {"deadline_ms": 10**9}}, {"budget": {"max_steps": "many"}},
        {"params": {"model": "gpt-9"}},
    ]  # fmt: skip
    for change in bad:
        args = {
            "tenant": tenant,
            "user": USER,
            "job": "support",
            "goal": GOAL,
            "params": {},
            "queue": queue,
            **change,
        }
        with pytest.raises(SubmissionError):
            client.submit(
                args.pop("tenant"),
                args.pop("user"),
                args.pop("job"),
                args.pop("goal"),
                args.pop("params"),
                **args,
            )
    client.ledger.set_ceiling(f"small-{unique}", "cost_microusd", 1000)
    with pytest.raises(SubmissionError, match="allows 1000"):
        client.submit(f"small-{unique}", USER, "support", GOAL, {}, queue=queue)
    assert (
        redis.Redis.from_url(client.config.redis_url or "").exists(keys.run(f"small-{unique}", "x"))
        == 0
    )


# -- hardening: holds, closings, attempts, the sweeper (issue 9) ------------------------------


def _finished(client: Client, tenant: str, run_id: str) -> list[dict[str, Any]]:
    return [e for _, e in client.store.events(tenant, run_id) if e["type"] == "finished"]


def _in_turn(client: Client, tenant: str, run_id: str, version: int) -> bool:
    """The step of `version` has loaded the run and not committed: its turn is in flight."""
    pipe = client.client.pipeline(transaction=True)
    pipe.hget(keys.run(tenant, run_id), "version")
    pipe.hexists(keys.inflight(tenant), run_id)
    stored, inflight = pipe.execute()
    return bool(stored == str(version) and inflight)


def _kill_turn(client: Client, tenant: str, run_id: str) -> None:
    inflight = client.client.hget(keys.inflight(tenant), run_id)
    assert inflight is not None, "the turn is in flight"
    os.kill(int(str(inflight).split("|")[1]), signal.SIGKILL)


def test_a_turn_killed_then_cancelled_or_parked_leaves_no_hold_and_closes_truthfully(
    client: Client, queue: str, unique: str
) -> None:
    """Two turns are killed after their refund: the next delivery of one finds a cancel, of
    the other a paused tenant. Neither leaves a ledger hold behind (each tenant is charged
    exactly what its run recorded), and the cancelled run's closing says the refund was
    issued, as the shop records, though its state never committed it."""
    cancelled, parked = f"c-{unique}", f"p-{unique}"
    slow = {"sleep_s": {"issue_refund": 3.0}}
    shop = RedisShop(client.client)
    first = client.submit(cancelled, USER, "support", GOAL, slow, queue=queue)
    wait_until(lambda: shop.effects(cancelled, first) != [], what="the first refund is issued")
    assert client.cancel(first, by="ops") == "requested"  # its turn is in flight
    _kill_turn(client, cancelled, first)
    second = client.submit(parked, USER, "support", GOAL, slow, queue=queue)
    wait_until(lambda: shop.effects(parked, second) != [], what="the second refund is issued")
    flags.pause(client, Subject(tenant=parked), by="ops")
    _kill_turn(client, parked, second)
    wait_until(lambda: client.run_hash(first)[1]["status"] == "stopped", what="cancelled")
    wait_until(lambda: client.run_hash(second)[1]["status"] == "parked", what="parked")
    assert client.state(first).outcome == "cancelled"
    ledger_is_the_runs_usage(client, cancelled, [first])
    ledger_is_the_runs_usage(client, parked, [second])
    (finished,) = _finished(client, cancelled, first)
    assert "the refund was issued" in finished["message"], finished["message"]
    assert shop.effects(cancelled, first) == [["refund", "ord_1001", 3000]]


@pytest.mark.slow  # over 10 s on 2 cores: CI runs it in the slow part
def test_a_malformed_message_mid_turn_leaves_no_hold(
    client: Client, queue: str, pool: list[WorkerProcess], unique: str, redis_url: str
) -> None:
    """A malformed message ends a run whose turn is in flight: the turn's hold is released
    with the run's end, and the tenant is charged exactly what the run recorded."""
    tenant, bad = f"t-{unique}", f"bad-{unique}"
    # A worker of its own reads the bad message while the turn runs on the pool.
    with running_workers(redis_url, [bad], 1, prefix="bad", pool=pool[0].pool):
        run_id = client.submit(
            tenant, USER, "support", GOAL, {"sleep_s": {"get_order": 4.0}}, queue=queue
        )
        wait_until(lambda: _in_turn(client, tenant, run_id, 2), every_s=0.01, what="turn 2")
        producer(Settings(redis_url=redis_url)).send_task(
            STEP_TASK,
            kwargs={"tenant": tenant, "run_id": run_id, "version": "seven", "queue": queue},
            queue=bad,
        )
        wait_until(lambda: client.run_hash(run_id)[1]["status"] == "stopped", what="it ends")
    wait_until(
        lambda: any(e.get("run_id") == run_id for w in pool for e in w.events("turn_discarded")),
        what="the overtaken turn is discarded",
    )
    assert client.run_hash(run_id)[1]["outcome"] == "error"
    ledger_is_the_runs_usage(client, tenant, [run_id])
    (finished,) = _finished(client, tenant, run_id)
    assert finished["message"].startswith("Something went wrong on our side")


def test_a_malformed_message_stores_a_bounded_reason(
    client: Client, queue: str, unique: str, redis_url: str
) -> None:
    """A message with an 8 MB positional argument ends its run `error` with a reason of at
    most 500 characters: the run's hash stays small."""
    tenant = f"t-{unique}"
    run_id = client.submit(tenant, USER, "support", GOAL, {}, queue=f"nobody-{unique}")
    producer(Settings(redis_url=redis_url)).send_task(
        STEP_TASK,
        args=["x" * 8_000_000],
        kwargs={"tenant": tenant, "run_id": run_id, "version": 1, "queue": queue},
        queue=queue,
    )
    wait_until(lambda: client.run_hash(run_id)[1]["status"] == "stopped", what="it ends")
    stored = client.run_hash(run_id)[1]
    assert stored["outcome"] == "error" and "positional arguments" in stored["reason"]
    assert len(stored["reason"]) <= 500
    assert int(client.client.memory_usage(keys.run(tenant, run_id)) or 0) < 100_000
    client.client.delete(f"nobody-{unique}")


def test_the_sweeper_sends_a_waiting_step_once_and_cancel_ends_an_idle_run_at_once(
    client: Client, pool: list[WorkerProcess], unique: str, redis_url: str
) -> None:
    """A run on a queue that no worker reads: its lease lapses again and again, but the
    sweeper re-sends its step once, as that copy is still waiting on the broker. Its turn is
    not in flight, so `cancel` ends it at once, with its finished event and closing."""
    tenant, nobody = f"t-{unique}", f"nobody-{unique}"
    client = client_for(redis_url, pickup_lease_s=1)  # the submission's lease lapses soon
    run_id = client.submit(tenant, USER, "support", GOAL, {}, queue=nobody)

    def waited(times: int) -> bool:
        seen = [e for w in pool for e in w.events("step_waiting") if e.get("run_id") == run_id]
        return len(seen) >= times

    wait_until(lambda: waited(3), timeout_s=40, what="three sweeps find the step waiting")
    assert layout.broker_depth(redis_url, nobody) == 2  # the submission's and one re-send
    assert client.cancel(run_id, by="ops") == "cancelled"
    stored = client.run_hash(run_id)[1]
    assert (stored["status"], stored["outcome"]) == ("stopped", "cancelled")
    (finished,) = _finished(client, tenant, run_id)
    assert finished["message"].startswith("Your request was cancelled.")
    assert client.client.zscore(keys.leases(tenant), run_id) is None
    client.client.delete(nobody)
    ledger_is_the_runs_usage(client, tenant, [run_id])


@pytest.mark.slow  # over 10 s on 2 cores: CI runs it in the slow part
def test_a_store_outage_at_commit_does_not_use_up_an_attempt(unique: str, worker_pool: str) -> None:
    """With one delivery allowed per step, a turn whose commit fails because the store went
    down is retried when it is back and the run completes: only deliveries that died mid-turn
    count against the limit."""
    with EmbeddedServer() as broker, EmbeddedServer(appendonly=True) as store:
        queue = f"outage-{unique}"
        env = {"TURNSTILE_MAX_STEP_ATTEMPTS": "1"}
        with running_workers(
            store.url, [queue], 1, broker_url=broker.url, env=env, pool=worker_pool
        ) as workers:
            client = client_for(store.url, broker_url=broker.url)
            run_id = client.submit(
                "t", USER, "support", GOAL, {"sleep_s": {"get_order": 2.0}}, queue=queue
            )
            # Its second turn sleeps in get_order, then commits.
            wait_until(lambda: _in_turn(client, "t", run_id, 2), every_s=0.01, what="turn 2")
            store.stop()
            wait_until(lambda: workers[0].events("step_retry") != [], what="the commit fails")
            store.start()
            client = client_for(store.url, broker_url=broker.url)
            wait_until(lambda: settled(client, [run_id]), timeout_s=60, what="the run ends")
            stored = client.run_hash(run_id)[1]
            assert stored["outcome"] == "completed", stored["reason"]


def test_a_cancel_requested_during_a_turn_that_suspends_ends_the_run(
    client: Client, queue: str, unique: str
) -> None:
    """A cancel requested while the turn that suspends the run (G's refund, held for a person)
    is in flight ends the run `cancelled` as that turn commits, instead of leaving a
    suspended run with a request that no step will ever read."""
    tenant = f"t-{unique}"
    params = {**BY_LETTER["G"].params, "model_sleep_s": 1.5}
    run_id = client.submit(tenant, USER, "support", GOAL, params, queue=queue)
    wait_until(lambda: _in_turn(client, tenant, run_id, 3), every_s=0.01, what="turn 3 runs")
    assert client.cancel(run_id, by="ops", reason="customer called") == "requested"
    wait_until(lambda: client.run_hash(run_id)[1]["status"] == "stopped", what="cancelled")
    state = client.state(run_id)
    assert (state.outcome, state.reason) == ("cancelled", "customer called")
    assert len(_finished(client, tenant, run_id)) == 1
    ledger_is_the_runs_usage(client, tenant, [run_id])
