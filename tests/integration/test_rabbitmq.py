"""RabbitMQ as the broker: quorum queues, the depth read by AMQP, the failure matrix (a worker
SIGKILLed mid-turn, every message delivered twice, the store down and back, the broker down
and back), dead letters of unreadable messages, and a broker that refuses or does not answer.

These tests use RabbitMQ 3 at 127.0.0.1:5672 (guest/guest) and skip when it is not reachable.
Each works on queues of its own, deleted afterwards, and the module on a store of its own. The
pause and drain controls on RabbitMQ are test_controls.py's, run on both brokers.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from kombu import Connection, Exchange, Producer
from typer.testing import CliRunner

from tests.cluster import EmbeddedCluster
from tests.integration.rabbitmq import AMQP_URL, TcpProxy, own_queues, unreachable
from tests.integration.test_chaos import _raw_bytes
from tests.integration.test_worker import (
    scenarios_end_as_in_process,
    sigkill_after_the_refund,
    store_down_then_back,
)
from tests.integration.workers import (
    WorkerProcess,
    client_for,
    ended_once,
    ledger_is_the_runs_usage,
    running_workers,
    settled,
    wait_until,
)
from turnstile.jobs.support.scenarios import GOAL, USER
from turnstile.worker.broker import amqp, deadletters, layout
from turnstile.worker.broker.deadletters import Reason
from turnstile.worker.cli.main import app
from turnstile.worker.dev.embedded import EmbeddedServer
from turnstile.worker.dev.shop import RedisShop
from turnstile.worker.ops import queues as queue_views
from turnstile.worker.scheduling.dispatcher import Dispatcher
from turnstile.worker.settings import Settings
from turnstile.worker.store import keys

REASON = unreachable()
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(REASON is not None, reason=REASON or ""),
]

runner = CliRunner()


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    """A store of this module's own: a worker's dispatcher serves every queue of its store,
    and one publishing to RabbitMQ must not take the steps of the Redis-broker tests that
    share the suite's store."""
    with EmbeddedServer() as server:
        yield server.url


@pytest.fixture
def queue(unique: str) -> Iterator[str]:
    """A queue of this test's own on RabbitMQ, deleted after it."""
    with own_queues(f"rmq-{unique}") as (name,):
        yield name


def _publish_raw(queue: str, body: bytes, **properties: Any) -> None:
    """A message as any AMQP client could put it on the queue (by its broker name), past
    Celery."""
    name = layout.broker_queue(queue)
    with Connection(AMQP_URL) as conn:
        producer = Producer(conn.channel(), exchange=Exchange(name, type="topic"))
        producer.publish(body, routing_key=name, **properties)


def test_a_queue_is_a_quorum_queue_whose_depth_is_read_by_amqp(
    redis_url: str, queue: str, unique: str
) -> None:
    """With no worker on it, the steps sent wait on a quorum queue (declaring it classic is
    refused as inequivalent), and the queue views, `turnstile queues` and the dispatcher read
    its depth by a passive declare."""
    client = client_for(redis_url, AMQP_URL, fair_share=False)  # straight to the broker
    runs = [client.submit(f"t-{unique}", USER, "support", GOAL, {}, queue=queue) for _ in range(3)]
    assert client.deferred == []  # every step was confirmed by the broker
    assert layout.broker_depth(AMQP_URL, queue) == 3
    assert queue_views.queue_view(client, queue).depth == 3
    result = runner.invoke(
        app, ["queues", "--json"],
        env={"TURNSTILE_REDIS_URL": redis_url, "TURNSTILE_BROKER_URL": AMQP_URL},
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert '"depth": 3' in result.stdout and queue in result.stdout
    depth = layout.depth_reader(AMQP_URL, redis.Redis.from_url)
    assert isinstance(depth, amqp.QueueDepth)  # one connection and channel, kept
    with depth:
        config = Settings(redis_url=redis_url)
        dispatcher = Dispatcher(client.client, depth, config, lambda b: None)
        assert dispatcher.depth(queue) == 3
        assert dispatcher.depth(f"nobody-{unique}") == 0  # never declared: nothing waits there
        assert dispatcher.depth(queue) == 3  # the reader goes on after the 404
    with Connection(AMQP_URL) as conn, pytest.raises(Exception, match="inequivalent arg"):
        channel: Any = conn.channel()
        channel.queue_declare(layout.broker_queue(queue), durable=True,
                              arguments={"x-queue-type": "classic"})  # fmt: skip
    with running_workers(redis_url, [queue], 1, broker_url=AMQP_URL):
        wait_until(lambda: settled(client, runs), timeout_s=60, what="the three runs end")
    assert layout.broker_depth(AMQP_URL, queue) == 0


def test_scenarios_with_every_message_delivered_twice_end_as_in_process(
    redis_url: str, queue: str, unique: str
) -> None:
    """A-H on two workers over RabbitMQ, every step message sent twice: one turn per version,
    final states and effects those of a single delivery."""
    scenarios_end_as_in_process(
        redis_url, queue, f"t-{unique}", {"TURNSTILE_CHAOS_SEND_COPIES": "2"}, "prefork",
        broker_url=AMQP_URL,
    )  # fmt: skip


@pytest.mark.slow  # over 14 s on 2 cores: CI runs it in the slow part
def test_sigkill_mid_turn_ends_the_run_once_with_the_ledger_exact(
    redis_url: str, queue: str, unique: str
) -> None:
    """A pool process SIGKILLed after its refund, before its commit: RabbitMQ gives the step
    back (reject on worker lost), the run ends once, one refund, the ledger exact."""
    with running_workers(redis_url, [queue], 2, broker_url=AMQP_URL):
        sigkill_after_the_refund(client_for(redis_url, AMQP_URL), queue, f"t-{unique}")


@pytest.mark.slow
def test_the_store_down_then_back_retries_through_delayed_delivery(queue: str, unique: str) -> None:
    """The store stops mid-run: steps retry with a countdown, which a quorum queue cannot hold
    in the worker for free, so it waits in RabbitMQ's delayed delivery queues; every run
    finishes once the store is back."""
    with EmbeddedServer(appendonly=True) as store:
        store_down_then_back(store, AMQP_URL, queue, f"t-{unique}", "prefork")


@pytest.mark.slow
def test_the_broker_down_and_back_loses_nothing_and_runs_nothing_twice(
    redis_url: str, queue: str, unique: str
) -> None:
    """The worker's connection to RabbitMQ is cut (a proxy between them closes every
    connection and stops listening) while turns are in flight, and restored 5 s later: the
    worker reconnects, the steps RabbitMQ took back are delivered again, and every run ends
    once, completed, one refund each, the ledger exact, the worker never exiting."""
    tenant = f"t-{unique}"
    slow = {"sleep_s": {"get_order": 0.5, "issue_refund": 0.5, "send_status_email": 0.5}}
    with TcpProxy(("127.0.0.1", 5672)) as proxy:
        url = proxy.url()
        with running_workers(redis_url, [queue], 1, broker_url=url, concurrency=2) as (worker,):
            client = client_for(redis_url, url)
            runs = [
                client.submit(tenant, USER, "support", GOAL, slow, queue=queue) for _ in range(8)
            ]
            wait_until(
                lambda: client.client.hlen(keys.inflight(tenant)) > 0, what="a turn is in flight"
            )
            proxy.cut()
            time.sleep(5.0)  # the broker is away this long, whatever the worker does meanwhile
            proxy.restore()
            wait_until(
                lambda: settled(client, runs), timeout_s=150,
                what=lambda: f"every run ends after the broker is back; {worker.log()[-3000:]}",
            )  # fmt: skip
            assert worker.process is not None and worker.process.poll() is None, worker.log()
            assert "Connection to broker lost" in worker.log()  # the cut was felt
    shop = RedisShop(client.client)
    for run_id in runs:
        assert client.state(run_id).outcome == "completed", run_id
        assert shop.effects(tenant, run_id) == [["refund", "ord_1001", 3000], ["email", "ord_1001"]]
        ended_once(client, tenant, run_id)
    ledger_is_the_runs_usage(client, tenant, runs)


JUNK: list[tuple[bytes, dict[str, Any], Reason]] = [
    (b"\x00\x01\xff this is not a message", {"content_type": "application/json",
                                             "content_encoding": "binary"}, Reason.BAD_BODY),
    (b'{"nope": 1}', {"content_type": "application/json", "content_encoding": "utf-8"},
     Reason.UNKNOWN_FORMAT),
    (b"[[], {}, {}]", {"content_type": "application/json", "content_encoding": "utf-8",
                       "headers": {"task": "no.such.task", "id": "x1"}}, Reason.UNKNOWN_TASK),
    (b"[[], {}, {}]", {"content_type": "application/json", "content_encoding": "utf-8",
                       "headers": {"task": "turnstile.step", "id": "x2", "timelimit": "soon"}},
     Reason.BAD_HEADERS),
    (b"just bytes", {"content_type": "application/x-nothing", "content_encoding": "binary"},
     Reason.BAD_BODY),  # a content type the worker does not accept
]  # fmt: skip


def test_unreadable_messages_are_dead_lettered_in_the_store_and_acked(
    redis_url: str, queue: str, unique: str
) -> None:
    """Messages no worker can take in, put on the quorum queue by another AMQP client, are
    each kept with their reason in the queue's dead letters (in the store), acked (the queue
    is empty, nothing is redelivered), and the worker goes on to run a real run."""
    client = client_for(redis_url, AMQP_URL)
    with running_workers(redis_url, [queue], 1, broker_url=AMQP_URL) as (worker,):
        for body, properties, _ in JUNK:
            _publish_raw(queue, body, **properties)
        wait_until(
            lambda: len(deadletters.listing(client.client, queue)) == len(JUNK),
            timeout_s=30, what=lambda: f"every junk message dead-lettered; {worker.log()[-2000:]}",
        )  # fmt: skip
        run_id = client.submit(f"t-{unique}", USER, "support", GOAL, {}, queue=queue)
        wait_until(lambda: settled(client, [run_id]), timeout_s=60, what="a real run ends")
        assert worker.process is not None and worker.process.poll() is None
    letters = deadletters.listing(client.client, queue)
    got = {(_raw_bytes(d), d.reason) for d in letters}
    assert got == {(body, r.value) for body, _, r in JUNK}, [
        (d.raw, d.reason, d.detail) for d in letters
    ]
    assert all(d.queue == queue and d.detail for d in letters)
    assert layout.broker_depth(AMQP_URL, queue) == 0  # acked: nothing comes back
    assert queue_views.queue_view(client, queue).dead_letters == len(JUNK)
    result = runner.invoke(
        app, ["dead-letters", "list", "--queue", queue, "--json"],
        env={"TURNSTILE_REDIS_URL": redis_url, "TURNSTILE_BROKER_URL": AMQP_URL},
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert result.stdout.count('"reason"') == len(JUNK)


def test_unreadable_messages_are_dead_lettered_in_a_cluster_store(unique: str) -> None:
    """With RabbitMQ as the broker and a Valkey Cluster as the store (`redis+cluster://`), the
    messages no worker can take in are kept with their reason in the queue's dead letters in
    the cluster and acked, the worker goes on to run a real run, and `turnstile dead-letters`
    lists and drops them there."""
    with own_queues(f"rmq-{unique}") as (queue,), EmbeddedCluster() as cluster:
        client = client_for(cluster.url, AMQP_URL)
        with running_workers(cluster.url, [queue], 1, broker_url=AMQP_URL) as (worker,):
            for body, properties, _ in JUNK:
                _publish_raw(queue, body, **properties)
            wait_until(
                lambda: len(deadletters.listing(client.client, queue)) == len(JUNK),
                timeout_s=60,
                what=lambda: f"every junk message dead-lettered; {worker.log()[-2000:]}",
            )  # fmt: skip
            run_id = client.submit(f"t-{unique}", USER, "support", GOAL, {}, queue=queue)
            wait_until(lambda: settled(client, [run_id]), timeout_s=90, what="a real run ends")
            assert worker.process is not None and worker.process.poll() is None
        letters = deadletters.listing(client.client, queue)
        assert {(_raw_bytes(d), d.reason) for d in letters} == {
            (body, r.value) for body, _, r in JUNK
        }, [(d.raw, d.reason, d.detail) for d in letters]
        assert layout.broker_depth(AMQP_URL, queue) == 0  # acked: nothing comes back
        assert queue_views.queue_view(client, queue).dead_letters == len(JUNK)
        env = {"TURNSTILE_REDIS_URL": cluster.url, "TURNSTILE_BROKER_URL": AMQP_URL}
        listed = runner.invoke(app, ["dead-letters", "list", "--queue", queue, "--json"], env=env)
        assert listed.exit_code == 0, listed.output
        assert listed.stdout.count('"reason"') == len(JUNK)
        dropped = runner.invoke(app, ["dead-letters", "drop", "--all", "--queue", queue], env=env)
        assert dropped.exit_code == 0, dropped.output
        assert deadletters.listing(client.client, queue) == []


def _bad(url: str, **change: str) -> str:
    scheme, rest = url.split("://", 1)
    creds, _, tail = rest.rpartition("@")
    host, _, vhost = tail.partition("/")
    user, _, password = creds.partition(":")
    return (
        f"{scheme}://{user}:{change.get('password', password)}@{change.get('host', host)}"
        f"/{change.get('vhost', vhost)}"
    )


WRONG = "not-the-password"
BAD_BROKERS = [
    (_bad(AMQP_URL, password=WRONG), 2, "refused the login: wrong user or password"),
    (_bad(AMQP_URL, vhost="no-such-vhost"), 2, "refused the vhost"),
    (_bad(AMQP_URL, host="127.0.0.1:1"), 1, "unreachable"),
]


@pytest.mark.parametrize(("url", "code", "said"), BAD_BROKERS, ids=["password", "vhost", "host"])
def test_a_broker_that_refuses_or_does_not_answer_is_one_line_at_worker_start(
    redis_url: str, url: str, code: int, said: str
) -> None:
    """`turnstile worker` against wrong credentials, a vhost that is not there (at once) or a
    host that does not answer (after its start wait): one line naming it (without the
    password), before Celery starts."""
    result = runner.invoke(
        app, ["worker", "-Q", "q"], env={"TURNSTILE_REDIS_URL": redis_url,
                                         "TURNSTILE_BROKER_URL": url,
                                         "TURNSTILE_START_WAIT_S": "1"},
    )  # fmt: skip
    assert result.exit_code == code, result.output
    said = "did not answer within 1 s" if code == 1 else said  # the start wait, then the line
    assert result.stderr.count("\n") == 1 and said in result.stderr, result.stderr
    assert WRONG not in result.stderr


@pytest.mark.parametrize(("url", "code", "said"), BAD_BROKERS, ids=["password", "vhost", "host"])
def test_the_queue_views_say_in_one_line_that_the_broker_cannot_be_read(
    redis_url: str, unique: str, url: str, code: int, said: str
) -> None:
    """`turnstile queues` reads each queue's depth from the broker: one that refuses or does
    not answer is one line and exit 1, the password masked."""
    client = client_for(redis_url, fair_share=False)
    client.submit(f"t-{unique}", USER, "support", GOAL, {}, queue=f"rmq-{unique}")  # a queue
    result = runner.invoke(
        app, ["queues"], env={"TURNSTILE_REDIS_URL": redis_url, "TURNSTILE_BROKER_URL": url}
    )
    assert result.exit_code == 1, result.output
    assert result.stderr.count("\n") == 1 and said in result.stderr, result.stderr
    assert WRONG not in result.stderr


def test_a_celery_started_worker_with_a_wrong_vhost_exits_with_one_line(
    redis_url: str, unique: str
) -> None:
    """A worker Celery starts itself (`celery -A ... worker`) checks the broker as it starts:
    a wrong vhost is one line and an exit, not a login retried for ever."""
    url = _bad(AMQP_URL, vhost="no-such-vhost")
    worker = WorkerProcess(redis_url, [f"rmq-{unique}"], name=f"bad-{unique}", broker_url=url)
    worker.start()
    assert worker.process is not None
    assert worker.process.wait(60) != 0
    assert "refused the vhost" in worker.log(), worker.log()[-2000:]
    assert "Traceback" not in worker.log(), worker.log()[-2000:]


def test_a_submission_whose_broker_refuses_is_stored_for_the_sweeper(
    redis_url: str, unique: str
) -> None:
    """Sent straight to a broker that refuses the login (fair share off), a submission is
    stored with its pickup lease and the CLI says in one line that the step is sent later:
    nothing half-written, the sweeper of a worker with the right broker sends it."""
    tenant, run_id = f"t-{unique}", f"run_{unique}"
    env = {"TURNSTILE_REDIS_URL": redis_url, "TURNSTILE_FAIR_SHARE": "0",
           "TURNSTILE_BROKER_URL": _bad(AMQP_URL, password=WRONG)}  # fmt: skip
    result = runner.invoke(
        app, ["submit", "--job", "support", "--tenant", tenant, "--user", USER, "--goal", GOAL,
              "--run-id", run_id, "--queue", f"rmq-{unique}"],
        env=env,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert result.stderr.count("\n") == 1 and "sent when the broker is back" in result.stderr
    client = client_for(redis_url)
    assert client.run_hash(run_id, tenant)[1]["status"] == "running"
    assert client.client.zscore(keys.leases(tenant), run_id) is not None  # the sweeper's cue
