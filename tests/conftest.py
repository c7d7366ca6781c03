"""Shared fixtures: a real Redis-compatible server, started by the tests unless one is named.

`TURNSTILE_TEST_REDIS_URL` points the suite at an existing server. The suite never flushes a
server: every test works under names of its own (`unique` below), so a shared server is safe.
"""

from __future__ import annotations

import gc
import os
import sys
import tracemalloc
import uuid
import warnings
from collections.abc import Iterator

import pytest

from tests.cluster import EmbeddedCluster
from turnstile.worker.dev.embedded import EmbeddedServer

# Trace allocations in the test process only (PYTHONTRACEMALLOC would reach every worker process
# the tests start, and slow their start past the tests' patience).
if os.environ.get("TURNSTILE_TEST_TRACEMALLOC"):
    tracemalloc.start(int(os.environ["TURNSTILE_TEST_TRACEMALLOC"]))


# How many pytest-xdist processes `-n auto` (the default, pyproject.toml) starts: the tests mostly
# wait (on workers starting and stopping, leases, a tool's sleep), about half of one core in all
# when run one after another, so four processes keep two cores busy (measured: 1,047 tests in
# 289-299 s in four, against 378 s for 590 of them in two). TURNSTILE_TEST_PROCESSES overrides.
TEST_PROCESSES = 4


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """The process count for `-n auto`: TURNSTILE_TEST_PROCESSES, else TEST_PROCESSES."""
    return int(os.environ.get("TURNSTILE_TEST_PROCESSES", TEST_PROCESSES))


def pytest_configure(config: pytest.Config) -> None:
    """The suite's clients and commands may submit to any queue name: each test uses queues
    of its own, most of which no worker serves (runs kept waiting on purpose). The tests of
    who may submit where (tests/integration/test_queue_isolation.py) set the rule they test."""
    os.environ.setdefault("TURNSTILE_SUBMIT_QUEUES", "*")


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """URL of a server for the whole session: the named one, or one started here."""
    named = os.environ.get("TURNSTILE_TEST_REDIS_URL")
    if named:
        yield named
        return
    with EmbeddedServer() as server:
        yield server.url


@pytest.fixture(scope="session")
def cluster_url() -> Iterator[str]:
    """URL (`redis+cluster://`) of a 3-primary Valkey Cluster for the session, started on first
    use: the store and the ledger on a cluster. `TURNSTILE_TEST_CLUSTER_URL` names one instead."""
    named = os.environ.get("TURNSTILE_TEST_CLUSTER_URL")
    if named:
        yield named
        return
    with EmbeddedCluster() as cluster:
        yield cluster.url


@pytest.fixture
def own_server() -> Iterator[EmbeddedServer]:
    """A server that this test alone owns, so it may stop and restart it."""
    with EmbeddedServer() as server:
        yield server


@pytest.fixture
def unique() -> str:
    """A fresh name, for tenants, runs and queues that no other test uses."""
    return uuid.uuid4().hex[:12]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Collect what the session left in reference cycles, and say what it found unclosed.

    A socket or a file left open fails a test (warnings are errors): the test that drops it,
    or, when it is caught in a reference cycle, whichever later test the garbage collector
    happens to run in (pytest does not collect per test; the integration tests close the
    clients they make for this reason, tests/integration/conftest.py). What is still in a
    cycle when the session ends would otherwise be collected by pytest after the last test
    and fail a run whose every test passed, without naming any test. Here it is collected
    first, and each one is reported on a line of its own; run with
    TURNSTILE_TEST_TRACEMALLOC=25 to see where it was made.
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        for _ in range(3):
            gc.collect()
    for warning in caught:
        print(f"\nleft unclosed at the end of the session: {warning.message}", file=sys.stderr)
        # With TURNSTILE_TEST_TRACEMALLOC=N, where it was made (N frames).
        made = tracemalloc.get_object_traceback(warning.source) if warning.source else None
        for line in made.format() if made else ():
            print(line, file=sys.stderr)
