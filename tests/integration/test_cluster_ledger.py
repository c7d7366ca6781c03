"""The ledger's four-process contention test (test_ledger_concurrency.py) with the ledger on a
3-primary Valkey Cluster: this module's `redis_url` is the cluster's."""

from __future__ import annotations

import pytest

from tests.integration import test_ledger_concurrency as on_one_server

pytestmark = pytest.mark.integration


@pytest.fixture
def redis_url(cluster_url: str) -> str:
    return cluster_url


test_four_processes_never_overshoot_and_every_unit_adds_up = (
    on_one_server.test_four_processes_never_overshoot_and_every_unit_adds_up
)
