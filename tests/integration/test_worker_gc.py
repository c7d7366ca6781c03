"""The cyclic collector in a worker (worker/runtime/hooks.py `GcHook`): run less often, and the
worker's start-up set aside from it, on either pool; runs end as before."""

from __future__ import annotations

import pytest

from tests.integration.workers import client_for, running_workers, wait_until
from turnstile.jobs.support.scenarios import GOAL, USER
from turnstile.worker.runtime.hooks import GC_THRESHOLDS

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("pool", ["prefork", "gevent"])
def test_a_worker_collects_less_often_and_sets_its_start_up_aside(
    redis_url: str, unique: str, pool: str
) -> None:
    queue, tenant = f"gc-{pool}-{unique}", f"t-{unique}"
    with running_workers(redis_url, [queue], 1, pool=pool) as (worker,):
        wait_until(lambda: bool(worker.events("gc_tuned")), what="the gc_tuned line")
        (tuned,) = worker.events("gc_tuned")
        assert tuple(tuned["thresholds"]) == GC_THRESHOLDS
        # The modules, the app, the jobs and the clients: far more objects than a turn makes.
        assert tuned["frozen"] > 50_000
        client = client_for(redis_url)
        runs = [client.submit(tenant, USER, "support", GOAL, queue=queue) for _ in range(3)]
        wait_until(
            lambda: all(client.run_hash(r)[1]["status"] == "stopped" for r in runs),
            timeout_s=60,
            what="every run ends",
        )
        assert {client.state(r).outcome for r in runs} == {"completed"}
