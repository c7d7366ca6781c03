"""Celery's `worker_disable_prefetch` on the guarded Redis transport: a worker reads a step only
while a slot of its pool is free, and a take (transport.py, broker_take.lua), which reads several
at once, takes no more than the free slots, though the prefetch credit allows more."""

from __future__ import annotations

import threading

import pytest
import redis

from tests.integration.workers import WorkerProcess, client_for, wait_until
from turnstile.jobs.support.scenarios import GOAL, USER
from turnstile.worker.dev.embedded import EmbeddedServer

pytestmark = pytest.mark.integration

RUNS = 6


def test_a_worker_with_prefetch_disabled_holds_no_more_than_its_slots(
    own_server: EmbeddedServer, unique: str
) -> None:
    """One prefork slot, a prefetch multiplier of 4 (a credit of 4), prefetch disabled, six runs'
    steps waiting: the broker's unacked records never hold more than the step running and the
    one read as its slot frees (a take sized by the credit alone held four); every run ends."""
    queue, tenant = f"np-{unique}", f"t-{unique}"
    client = client_for(own_server.url)
    runs = [client.submit(tenant, USER, "support", GOAL, {}, queue=queue) for _ in range(RUNS)]
    broker = redis.Redis.from_url(own_server.url)
    most, done = 0, threading.Event()

    def sample() -> None:
        nonlocal most
        while not done.is_set():
            most = max(most, int(broker.hlen("unacked")))
            done.wait(0.002)

    worker = WorkerProcess(own_server.url, [queue], name=f"np-{unique}")
    worker.args += ["--disable-prefetch", "--prefetch-multiplier", "4"]
    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        worker.start()
        wait_until(
            lambda: all(client.run_hash(r)[1].get("status") == "stopped" for r in runs),
            timeout_s=90,
            what="every run ends",
        )
    finally:
        done.set()
        sampler.join()
        worker.stop()
        broker.close()
    assert 0 < most <= 2, most
