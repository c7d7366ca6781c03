"""The dispatcher's batch send (worker/broker/producer.py `send_steps`): every step of a batch
reaches its queue's list in the order given, and each queue is declared (its binding written)
though only its first step in the batch declares it."""

from __future__ import annotations

import json
import uuid

import pytest
import redis

from turnstile.worker.broker import producer
from turnstile.worker.broker.app import make_app
from turnstile.worker.broker.layout import broker_queue
from turnstile.worker.broker.message import StepMessage
from turnstile.worker.dev.embedded import EmbeddedServer
from turnstile.worker.settings import Settings

pytestmark = pytest.mark.integration


def test_a_batch_on_two_new_queues_reaches_both_in_order_each_bound() -> None:
    """Steps on two queues never declared, interleaved in one batch: each queue's list holds
    its own steps in the order sent, and each has its binding (a queue declared only by a
    later step of the batch would have none, and a worker's read would not route to it)."""
    with EmbeddedServer() as server:
        app = make_app(Settings(redis_url=server.url))
        names = [f"q{uuid.uuid4().hex[:6]}", f"q{uuid.uuid4().hex[:6]}"]
        batch = [(StepMessage("t", f"run{n}", 2, names[n % 2]), 60.0, 120.0) for n in range(6)]
        producer.send_steps(app, batch)
        broker = redis.Redis.from_url(server.url, decode_responses=True)
        for i, name in enumerate(names):
            listed = broker.lrange(broker_queue(name), 0, -1)
            run_ids = [json.loads(item)["headers"]["kwargsrepr"] for item in reversed(listed)]
            assert [r.split("'run_id': '")[1].split("'")[0] for r in run_ids] == [
                f"run{n}" for n in range(i, 6, 2)
            ]
            assert broker.exists(f"_kombu.binding.{broker_queue(name)}")
