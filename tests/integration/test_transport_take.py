"""The guarded Redis transport's take (worker/store/lua/broker_take.lua): a consumer's read pops
several messages at once, up to its prefetch credit, and records each as unacked in the same
script, as kombu's QoS records one after a BRPOP; what it took survives a worker killed right
after, a bad entry among them is still dead-lettered, and a broken queue is still left out
(issue 36)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from contextlib import suppress
from typing import Any, cast

import pytest
import redis
from kombu import Connection, Consumer, Exchange, Producer, Queue
from structlog.testing import capture_logs

from tests.integration.test_deadletters import ARGS, envelope, step_headers
from turnstile.worker.broker import transport
from turnstile.worker.broker.transport import Channel, Transport
from turnstile.worker.dev.embedded import EmbeddedServer
from turnstile.worker.store import keys

pytestmark = pytest.mark.integration

WAIT_S = 5.0


@pytest.fixture(scope="module")
def broker_url() -> Iterator[str]:
    """A server of this module's own: its unacked records and scripts are no other test's
    (the first take meets NOSCRIPT and loads the script)."""
    with EmbeddedServer() as server:
        yield server.url


def _queue(name: str) -> Queue:
    return Queue(name, Exchange(name, type="direct"), routing_key=name)


def _first_read(conn: Connection, got: list[Any]) -> None:
    """The consumer's first read, read again once if it brought nothing: on a server that has
    not seen the take script yet it meets NOSCRIPT and loads it."""
    for _ in range(2):
        if not got:
            conn.drain_events(timeout=WAIT_S)


def _five_read_once(
    conn: Connection, queue: Queue, got: list[Any], prefetch: int, free_slots: int | None = None
) -> Consumer:
    """Five messages published to `queue`, and a consumer of it with this prefetch credit (and
    this many free slots, as Celery's `worker_disable_prefetch` tells the QoS) after its first
    read: what that read handed over is in `got`."""
    _publish(conn, queue, 5)
    consumer = Consumer(conn.default_channel, [queue], callbacks=[lambda body, m: got.append(m)])
    consumer.qos(prefetch_count=prefetch)
    if free_slots is not None:
        cast(Any, conn.default_channel).qos.free_slots = lambda: free_slots
    consumer.consume()
    _first_read(conn, got)
    return consumer


def _publish(conn: Connection, queue: Queue, count: int) -> None:
    producer = Producer(conn.default_channel)
    for n in range(count):
        producer.publish({"n": n}, exchange=queue.exchange, routing_key=queue.routing_key,
                         declare=[queue])  # fmt: skip


def _unacked(server: redis.Redis) -> dict[str, Any]:
    return {str(k): json.loads(v) for k, v in server.hgetall("unacked").items()}


def test_a_read_takes_up_to_the_credit_each_recorded_unacked(broker_url: str) -> None:
    """Five messages waiting, a prefetch of three: one read hands over three, oldest first,
    each in kombu's unacked records as its QoS writes them (the envelope, exchange, routing
    key; the index scored by the time taken); no more until an ack frees credit; the acks
    remove the records."""
    name = f"take-{uuid.uuid4().hex[:8]}"
    queue = _queue(name)
    server = redis.Redis.from_url(broker_url, decode_responses=True)
    got: list[Any] = []
    with Connection(broker_url, transport=Transport) as conn:
        consumer = _five_read_once(conn, queue, got, prefetch=3)
        assert [m.payload["n"] for m in got] == [0, 1, 2]
        records = _unacked(server)
        assert set(records) == {m.delivery_tag for m in got}
        for m in got:
            raw, exchange, routing_key = records[m.delivery_tag]
            assert (raw, exchange, routing_key) == (m._raw, name, name)
        assert set(server.zrange("unacked_index", 0, -1)) == set(records)
        with pytest.raises(TimeoutError):  # no credit left: nothing more is read
            conn.drain_events(timeout=0.5)
        assert server.llen(name) == 2
        for m in got:
            m.ack()
        conn.drain_events(timeout=WAIT_S)
        assert [m.payload["n"] for m in got] == [0, 1, 2, 3, 4]
        for m in got[3:]:
            m.ack()
        consumer.cancel()
    assert server.hlen("unacked") == 0 and server.zcard("unacked_index") == 0
    server.close()


def test_an_ack_and_a_reject_remove_the_record_a_requeue_puts_the_message_back(
    broker_url: str,
) -> None:
    """The QoS's ack and its reject without requeue (one script call each, broker_ack.lua)
    remove the message's unacked record from both the hash and the index; a reject with
    requeue puts the message back on its list, as kombu's does; and after a flush of the
    server (the script gone) an ack still removes its record."""
    name = f"ack-{uuid.uuid4().hex[:8]}"
    queue = _queue(name)
    server = redis.Redis.from_url(broker_url, decode_responses=True)
    got: list[Any] = []
    with Connection(broker_url, transport=Transport) as conn:
        consumer = _five_read_once(conn, queue, got, prefetch=3)
        acked, rejected, requeued = got
        acked.ack()
        rejected.reject(requeue=False)
        assert set(_unacked(server)) == {requeued.delivery_tag}
        assert server.zrange("unacked_index", 0, -1) == [requeued.delivery_tag]
        requeued.reject(requeue=True)
        assert server.hlen("unacked") == 0 and server.zcard("unacked_index") == 0
        assert server.llen(name) == 3  # the two never read, and the one requeued
        server.script_flush()  # both scripts gone: the take and the ack load theirs again
        for _ in range(2):
            if len(got) == 3:
                conn.drain_events(timeout=WAIT_S)
        assert len(got) > 3
        for m in got[3:]:
            m.ack()
        consumer.cancel()
    assert server.hlen("unacked") == 0 and server.zcard("unacked_index") == 0
    server.close()


def test_a_take_takes_no_more_than_the_free_slots_with_prefetch_disabled(broker_url: str) -> None:
    """With Celery's `worker_disable_prefetch` (its consumer sets the QoS's `free_slots`:
    intake.py), a read takes no more than the slots free, though the prefetch credit allows
    more: five waiting, a credit of ten, two slots free: one read hands over two."""
    name = f"take-{uuid.uuid4().hex[:8]}"
    queue = _queue(name)
    server = redis.Redis.from_url(broker_url, decode_responses=True)
    got: list[Any] = []
    with Connection(broker_url, transport=Transport) as conn:
        consumer = _five_read_once(conn, queue, got, prefetch=10, free_slots=2)
        assert [m.payload["n"] for m in got] == [0, 1]
        assert server.llen(name) == 3
        for m in got:
            m.ack()
        consumer.cancel()
    server.close()


KILLED_CONSUMER = textwrap.dedent("""
    import os, signal, sys
    from kombu import Connection, Consumer, Exchange, Queue
    from turnstile.worker.broker.transport import Transport
    url, name = sys.argv[1:]
    queue = Queue(name, Exchange(name, type="direct"), routing_key=name)
    def killed(body, message):  # the first message handed over: the worker dies
        os.kill(os.getpid(), signal.SIGKILL)
    with Connection(url, transport=Transport) as conn:
        consumer = Consumer(conn.default_channel, [queue], callbacks=[killed])
        consumer.qos(prefetch_count=4)
        consumer.consume()
        while True:
            conn.drain_events(timeout=5)
""")


def test_a_worker_killed_after_a_take_leaves_what_it_took_to_be_restored(
    broker_url: str,
) -> None:
    """A consumer killed as the first of its take's four messages is handed over: the four
    are off the list and in the unacked records (none lost), and kombu's restore of the
    unacked puts them back on the queue, where a consumer reads all six again."""
    name = f"killed-{uuid.uuid4().hex[:8]}"
    queue = _queue(name)
    server = redis.Redis.from_url(broker_url, decode_responses=True)
    with Connection(broker_url, transport=Transport) as conn:
        _publish(conn, queue, 6)
    died = subprocess.run([sys.executable, "-c", KILLED_CONSUMER, broker_url, name],
                          timeout=60, capture_output=True, check=False)  # fmt: skip
    assert died.returncode == -9, died.stderr.decode()[-2000:]
    assert server.llen(name) == 2
    taken = _unacked(server)
    assert sorted(raw["properties"]["delivery_info"]["routing_key"] for raw, _, _ in
                  taken.values()) == [name] * 4  # fmt: skip

    options = {"visibility_timeout": 0}  # every record is due for restoring now
    got: list[Any] = []
    with Connection(broker_url, transport=Transport, transport_options=options) as conn:
        channel = conn.default_channel
        assert isinstance(channel, Channel)
        channel.qos.restore_visible(num=100, interval=1)
        assert server.llen(name) == 6 and server.hlen("unacked") == 0
        consumer = Consumer(channel, [queue], callbacks=[lambda body, m: got.append(m)])
        consumer.qos(prefetch_count=10)
        consumer.consume()
        while len(got) < 6:
            conn.drain_events(timeout=WAIT_S)
        for m in got:
            m.ack()
        consumer.cancel()
    assert sorted(m.payload["n"] for m in got) == list(range(6))
    assert sum(bool(m.delivery_info.get("redelivered")) for m in got) == 4
    server.close()


def test_a_bad_entry_among_those_taken_is_dead_lettered(broker_url: str) -> None:
    """Among the entries a take pops, one that is not JSON, one with no delivery tag (neither
    can be recorded) and one recorded whose body is not base64 are dead-lettered as after a
    BRPOP, with no unacked record left of them; the good messages around them are handed
    over, recorded."""
    name = f"bad-{uuid.uuid4().hex[:8]}"
    queue = _queue(name)
    server = redis.Redis.from_url(broker_url, decode_responses=True)
    got: list[Any] = []
    with Connection(broker_url, transport=Transport) as conn:
        _publish(conn, queue, 1)
        bad_body = envelope(name, ARGS, step_headers())
        bad_body = bad_body.replace('"body": "', '"body": "!not base64 ', 1)
        for entry in (b"\xff\x00 not a message", envelope(name, ARGS, step_headers(),
                      delivery_tag=None), bad_body):  # fmt: skip
            server.lpush(name, entry)
        _publish(conn, queue, 1)
        consumer = Consumer(conn.default_channel, [queue],
                            callbacks=[lambda body, m: got.append(m)])  # fmt: skip
        consumer.qos(prefetch_count=10)
        consumer.consume()
        conn.drain_events(timeout=WAIT_S)
        assert [m.payload["n"] for m in got] == [0, 0]
        assert set(_unacked(server)) >= {m.delivery_tag for m in got}
        kept = [json.loads(e) for e in server.lrange(keys.dead_letters(name), 0, -1)]
        assert sorted(d["reason"] for d in kept) == ["bad_envelope", "bad_envelope", "not_json"]
        assert set(_unacked(server)) == {m.delivery_tag for m in got}
        for m in got:
            m.ack()
        consumer.cancel()
    assert server.llen(name) == 0
    server.delete(keys.dead_letters(name))
    server.srem(keys.DEAD_LETTER_QUEUES, name)
    server.close()


@pytest.mark.parametrize("broken_first", [True, False])
def test_a_take_leaves_out_a_queue_whose_list_is_broken(
    broker_url: str, broken_first: bool
) -> None:
    """A queue whose list is a string (WRONGTYPE): whether the take meets it before or after
    the healthy queue's messages, those are handed over, none lost, and the broken queue is
    left out of the channel's reads."""
    broken, healthy = f"x-{uuid.uuid4().hex[:8]}", f"y-{uuid.uuid4().hex[:8]}"
    server = redis.Redis.from_url(broker_url, decode_responses=True)
    got: list[Any] = []
    with Connection(broker_url, transport=Transport) as conn:
        _publish(conn, _queue(healthy), 3)
        order = [_queue(broken), _queue(healthy)]
        channel = conn.default_channel
        assert isinstance(channel, Channel)
        consumer = Consumer(channel, order if broken_first else order[::-1],
                            callbacks=[lambda body, m: got.append(m)])  # fmt: skip
        consumer.qos(prefetch_count=10)
        server.set(broken, "not a list")  # after the declare, as by hand on a live worker
        consumer.consume()
        for _ in range(4):
            if len(got) < 3:
                with suppress(TimeoutError):
                    conn.drain_events(timeout=1)
        assert sorted(m.payload["n"] for m in got) == [0, 1, 2]
        assert set(channel._broken_queues()) == {broken}
        assert set(_unacked(server)) >= {m.delivery_tag for m in got}
        for m in got:
            m.ack()
        consumer.cancel()
    assert server.llen(healthy) == 0 and server.get(broken) == "not a list"
    server.delete(broken)
    server.close()


def test_a_server_that_refuses_the_take_is_read_with_brpop(
    broker_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A take the server will not load (as a server older than Redis 7 refuses its shebang
    line) is said once and turns the channel's takes off: its reads are kombu's BRPOP, one
    message at a time, recorded by kombu's QoS."""
    body = "#!lua\nthis is not Lua"
    refused = (body, hashlib.sha1(body.encode(), usedforsecurity=False).hexdigest())
    monkeypatch.setattr(transport, "take_script", lambda: refused)
    name = f"old-{uuid.uuid4().hex[:8]}"
    queue = _queue(name)
    server = redis.Redis.from_url(broker_url, decode_responses=True)
    got: list[Any] = []
    with capture_logs() as logs, Connection(broker_url, transport=Transport) as conn:
        _publish(conn, queue, 3)
        channel = conn.default_channel
        assert isinstance(channel, Channel)
        consumer = Consumer(channel, [queue], callbacks=[lambda body, m: got.append(m)])
        consumer.qos(prefetch_count=10)
        consumer.consume()
        while len(got) < 3:
            conn.drain_events(timeout=WAIT_S)
        assert channel._turnstile_no_take
        assert set(_unacked(server)) >= {m.delivery_tag for m in got}
        for m in got:
            m.ack()
        consumer.cancel()
    assert [m.payload["n"] for m in got] == [0, 1, 2]
    assert [e["event"] for e in logs if e["event"] == "take_refused"] == ["take_refused"]
    server.close()
