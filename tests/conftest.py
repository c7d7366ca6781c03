"""Shared fixtures: a real Redis-compatible server, started by the tests unless one is named.

`TURNSTILE_TEST_REDIS_URL` points the suite at an existing server. The suite never flushes a
server: every test works under names of its own (`unique` below), so a shared server is safe.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

from worker.embedded import EmbeddedServer


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """URL of a server for the whole session: the named one, or one started here."""
    named = os.environ.get("TURNSTILE_TEST_REDIS_URL")
    if named:
        yield named
        return
    with EmbeddedServer() as server:
        yield server.url


@pytest.fixture
def own_server() -> Iterator[EmbeddedServer]:
    """A server that this test alone owns, so it may stop and restart it."""
    with EmbeddedServer() as server:
        yield server


@pytest.fixture
def unique() -> str:
    """A fresh name, for tenants, runs and queues that no other test uses."""
    return uuid.uuid4().hex[:12]
