"""The dispatcher's lock on a worker's warm shutdown (worker/scheduling/dispatcher.py): given up,
so the next worker's dispatcher leads at its next try, not when the lock lapses (LOCK_MS)."""

from __future__ import annotations

import time

import pytest
import redis

from tests.integration.workers import client_for, running_workers, wait_until
from turnstile.jobs.support.scenarios import GOAL, USER
from turnstile.worker.dev.embedded import EmbeddedServer
from turnstile.worker.scheduling.dispatcher import LOCK_MS
from turnstile.worker.store import keys

pytestmark = pytest.mark.integration


def test_a_stopped_worker_gives_the_dispatch_lock_up_and_the_next_leads_at_once(
    unique: str,
) -> None:
    queue, tenant = f"lock-{unique}", f"t-{unique}"
    with EmbeddedServer() as server:
        store = redis.Redis.from_url(server.url, decode_responses=True)
        try:
            with running_workers(server.url, [queue], 1, prefix="first") as (first,):
                wait_until(lambda: store.get(keys.FAIR_LOCK) is not None, what="a leader")
            # Stopped (a warm shutdown): the lock is gone with it, not left to lapse.
            assert store.get(keys.FAIR_LOCK) is None
            assert first.process is not None and first.process.poll() is not None
            client = client_for(server.url)
            runs = [client.submit(tenant, USER, "support", GOAL, queue=queue) for _ in range(3)]
            with running_workers(server.url, [queue], 1, prefix="second"):
                ready = time.monotonic()
                wait_until(lambda: store.get(keys.FAIR_LOCK) is not None, what="a new leader")
                assert time.monotonic() - ready < LOCK_MS / 1000
                wait_until(
                    lambda: all(client.run_hash(r)[1]["status"] == "stopped" for r in runs),
                    timeout_s=60,
                    what="every run ends",
                )
            assert {client.state(r).outcome for r in runs} == {"completed"}
        finally:
            store.close()
