"""The guarded Redis transport's poller: a consumer without an event loop (Celery's `synloop`,
the green pool's) takes the next message as soon as an ack frees its prefetch slot, instead
of waiting out its poll timeout (issue 36)."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

from kombu import Connection, Consumer, Exchange, Producer, Queue

from turnstile.worker.broker.transport import Transport

# What a test waits for the second message: kombu alone waits all of it.
WAIT_S = 5.0


def test_an_ack_that_frees_the_slot_wakes_the_wait(redis_url: str) -> None:
    """With a prefetch of one, the first message held unacked, a wait for the next message
    ends when another thread acks the first (as a green turn does), not at its timeout."""
    name = f"wake-{uuid.uuid4().hex[:8]}"
    queue = Queue(name, Exchange(name, type="direct"), routing_key=name)
    got: list[Any] = []
    with Connection(redis_url, transport=Transport) as conn:
        channel = conn.default_channel
        producer = Producer(channel)
        for n in range(2):
            producer.publish({"n": n}, exchange=queue.exchange, routing_key=name,
                             declare=[queue])  # fmt: skip
        consumer = Consumer(channel, [queue], callbacks=[lambda body, m: got.append(m)])
        consumer.qos(prefetch_count=1)
        consumer.consume()
        conn.drain_events(timeout=WAIT_S)
        assert [m.payload["n"] for m in got] == [0]
        acker = threading.Timer(0.2, got[0].ack)
        started = time.monotonic()
        acker.start()
        conn.drain_events(timeout=WAIT_S)
        waited = time.monotonic() - started
        acker.join()
        assert [m.payload["n"] for m in got] == [0, 1]
        assert waited < 1.5, f"the freed slot waited {waited:.2f} s for the poll's timeout"
        got[1].ack()
        consumer.cancel()
