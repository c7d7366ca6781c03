"""Retention: finished runs are removed with every key and index entry that names them once
their retention has run out; live runs and recently finished ones are kept. Each test owns
its server: a retention pass looks at every tenant on it."""

from __future__ import annotations

import pytest
import redis

from tests.integration.workers import client_for, running_workers, settled, wait_until
from turnstile.jobs.support.scenarios import GOAL, USER
from turnstile.worker.client._client import Client
from turnstile.worker.dev.embedded import EmbeddedServer
from turnstile.worker.scheduling import retention
from turnstile.worker.settings import Settings
from turnstile.worker.store import keys

pytestmark = pytest.mark.integration


def _traces(r: redis.Redis, tenant: str, run_id: str) -> list[str]:
    """Every key or index entry that still names the run."""
    found = [k for k in (keys.run(tenant, run_id), keys.events(tenant, run_id)) if r.exists(k)]
    if r.zscore(keys.runs(tenant), run_id) is not None:
        found.append("runs index")
    if r.zscore(keys.leases(tenant), run_id) is not None:
        found.append("lease")
    if r.hexists(keys.inflight(tenant), run_id):
        found.append("in flight")
    for status in ("running", "suspended", "parked", "stopped"):
        if r.sismember(keys.by_status(tenant, status), run_id):
            found.append(f"status {status}")
    found += [str(k) for k in r.scan_iter(f"{keys.PREFIX}:{{{tenant}}}:outcome:*")
              if r.sismember(k, run_id)]  # fmt: skip
    if r.hexists(keys.RUN_TENANTS, run_id):
        found.append("run-tenants")
    return found


def _submit(client: Client, tenant: str, queue: str) -> str:
    return client.submit(tenant, USER, "support", GOAL, {}, queue=queue)


def test_a_pass_removes_finished_runs_past_retention_and_keeps_the_rest(
    own_server: EmbeddedServer, unique: str
) -> None:
    """With a zero retention, a pass removes every finished run with its hash, stream and
    index entries; a live run is untouched; with a long retention nothing is removed. (No
    worker consumes the queue: runs are ended by the store's own `fail_run`.)"""
    client = client_for(own_server.url)
    r = client.client
    tenant, queue = f"t-{unique}", f"q-{unique}"
    ended = [_submit(client, tenant, queue) for _ in range(5)]
    live = _submit(client, tenant, queue)
    for run_id in ended:
        assert client.store.fail_run(tenant, run_id, "ended for the test").kind == "ok"

    kept = retention.retain(r, Settings(retain_finished_s=3600), client.ledger)
    assert kept.runs == 0
    assert all(_traces(r, tenant, run_id) for run_id in ended)

    done = retention.retain(r, Settings(retain_finished_s=0), client.ledger)
    assert done.runs == 5
    for run_id in ended:
        assert _traces(r, tenant, run_id) == [], run_id
    assert set(_traces(r, tenant, live)) == {
        keys.run(tenant, live), keys.events(tenant, live), "runs index", "lease",
        "status running", "run-tenants",
    }  # fmt: skip
    assert retention.retain(r, Settings(retain_finished_s=0), client.ledger).runs == 0


def test_a_removed_run_id_is_forgotten_and_another_tenants_claim_is_left_alone(
    own_server: EmbeddedServer, unique: str
) -> None:
    """After removal, the run id may be submitted again as a new run; a pass never clears a
    run-tenants entry that belongs to another tenant."""
    client = client_for(own_server.url)
    tenant, queue, run_id = f"t-{unique}", f"q-{unique}", f"r-{unique}"
    client.submit(tenant, USER, "support", GOAL, {}, queue=queue, run_id=run_id)
    client.store.fail_run(tenant, run_id, "ended for the test")
    # An index entry of another tenant's run with the same id: only its own entry is cleared.
    client.client.hset(keys.RUN_TENANTS, "shared-id", f"other-{unique}")
    client.client.zadd(keys.runs(tenant), {"shared-id": 1})
    assert retention.retain(client.client, Settings(retain_finished_s=0), client.ledger).runs == 2
    assert client.client.hget(keys.RUN_TENANTS, "shared-id") == f"other-{unique}"
    assert client.client.zscore(keys.runs(tenant), "shared-id") is None

    again = client.submit(tenant, USER, "support", "a new goal", {}, queue=queue, run_id=run_id)
    assert again == run_id and client.run_hash(run_id)[1]["status"] == "running"


def test_workers_remove_finished_runs_after_the_configured_retention(
    own_server: EmbeddedServer, unique: str
) -> None:
    """Real workers with TURNSTILE_RETAIN_FINISHED_S=1: support runs finish, then their
    sweeper's retention pass removes every trace of them, and the ledger's totals stay."""
    queue, tenant = f"q-{unique}", f"t-{unique}"
    env = {"TURNSTILE_RETAIN_FINISHED_S": "1", "TURNSTILE_RETENTION_INTERVAL_S": "0.5"}
    with running_workers(own_server.url, [queue], 1, env=env):
        client = client_for(own_server.url)
        runs = [_submit(client, tenant, queue) for _ in range(3)]
        wait_until(lambda: settled(client, runs), timeout_s=60, what="the runs finish")
        committed = client.ledger.read(tenant)["cost_microusd"].committed
        assert committed > 0
        wait_until(
            lambda: all(_traces(client.client, tenant, r) == [] for r in runs),
            timeout_s=30, what="retention removes the finished runs",
        )  # fmt: skip
        assert client.ledger.read(tenant)["cost_microusd"].committed == committed
