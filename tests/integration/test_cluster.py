"""The store and the ledger on a 3-primary Valkey Cluster, the broker on a standalone server:
the worker's own tests (test_worker.py), collected here again with this module's fixtures, so
the same bodies run against the cluster; and what only a cluster has (a URL and a server that
disagree, a primary killed mid-run)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from tests.integration import test_worker as on_one_server
from tests.integration.workers import WorkerProcess, client_for, running_workers
from turnstile.worker.client._client import Client

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def queue() -> str:
    return f"qc-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def pool(cluster_url: str, redis_url: str, queue: str) -> Iterator[list[WorkerProcess]]:
    """Two workers whose store is the cluster and whose broker is the standalone server."""
    with running_workers(cluster_url, [queue], 2, broker_url=redis_url) as workers:
        yield workers


@pytest.fixture
def client(cluster_url: str, redis_url: str, pool: list[WorkerProcess]) -> Client:
    return client_for(cluster_url, broker_url=redis_url)


# The scenarios A-H, approval, a turn killed mid-refund, a poison step, and the tenant cap
# across two workers: test_worker.py's bodies, over this module's fixtures.
test_scenarios_through_the_queue_match_in_process = (
    on_one_server.test_scenarios_through_the_queue_match_in_process
)
test_approving_a_suspended_run_resumes_it = on_one_server.test_approving_a_suspended_run_resumes_it
test_sigkill_in_the_middle_of_a_turn_does_not_refund_twice = (
    on_one_server.test_sigkill_in_the_middle_of_a_turn_does_not_refund_twice
)
test_a_step_that_keeps_killing_its_worker_ends_the_run_error = (
    on_one_server.test_a_step_that_keeps_killing_its_worker_ends_the_run_error
)
test_the_tenant_cap_holds_across_workers = on_one_server.test_the_tenant_cap_holds_across_workers
