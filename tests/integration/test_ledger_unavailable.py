"""Failing closed: a stopped or stalled server admits nothing, fast, and loses nothing."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from turnstile.ledger import Ledger, LedgerUnavailable
from turnstile.worker.dev.embedded import EmbeddedServer

pytestmark = pytest.mark.integration


@pytest.fixture
def durable_server() -> Iterator[EmbeddedServer]:
    """A server of this test's own, with AOF as in production, so a restart keeps the data."""
    with EmbeddedServer(appendonly=True) as server:
        yield server


def test_a_stopped_server_is_unavailable_at_once_and_consistent_after(
    durable_server: EmbeddedServer, unique: str
) -> None:
    """While the server is down every reserve answers "unavailable" within a second and admits
    nothing; settle raises; once it is back, retries by id finish the work consistently."""
    ledger = Ledger.from_url(durable_server.url, grace_s=0)
    ledger.set_ceiling(unique, "cost_microusd", 100)
    assert ledger.reserve(unique, "before", {"cost_microusd": 30}, timeout_s=60).admitted

    durable_server.stop()
    for attempt in range(5):
        started = time.monotonic()
        result = ledger.reserve(unique, f"down-{attempt}", {"cost_microusd": 1}, timeout_s=60)
        assert time.monotonic() - started < 1.0
        assert result.status == "unavailable" and not result.admitted
        assert "unavailable" in result.detail
    with pytest.raises(LedgerUnavailable):
        ledger.settle(unique, "before", {"cost_microusd": 20})
    with pytest.raises(LedgerUnavailable):
        ledger.read(unique)
    with pytest.raises(LedgerUnavailable):
        ledger.reap_all()

    durable_server.start()  # same port, same data, and an empty script cache
    assert ledger.settle(unique, "before", {"cost_microusd": 20}).replayed is False
    retried = ledger.reserve(unique, "down-0", {"cost_microusd": 1}, timeout_s=60)
    assert retried.admitted and not retried.replayed
    state = ledger.read(unique)["cost_microusd"]
    assert (state.committed, state.reserved) == (20, 1)
    assert ledger.rebuild(unique).corrected_fields == 0
    ledger.close()


def test_a_reserve_that_timed_out_but_ran_replays_on_retry(
    own_server: EmbeddedServer, unique: str
) -> None:
    """A reserve whose answer never came may still have been applied: the retry by the same id
    finds it and answers as the first time, without holding twice."""
    ledger = Ledger.from_url(own_server.url, timeout_s=0.2)
    ledger.set_ceiling(unique, "tokens", 100)
    ledger.reserve(unique, "warm", {"tokens": 1}, timeout_s=60)  # loads the reserve script
    # Its patience outlasts the busy script however loaded the machine (the script counts CPU
    # time, not the wall clock's), so the script has ended when its thread returns.
    admin = Ledger.from_url(own_server.url, timeout_s=60)
    # Keep the server busy for 1 s: the reserve waits in its socket, the client gives up
    # after 0.2 s, and the server runs the reserve once the busy script ends.
    busy = threading.Thread(
        target=admin.client.eval,
        args=("local s = os.clock() while os.clock() - s < 1.0 do end return 1", 0),
    )
    busy.start()
    _wait_busy(own_server.port)
    started = time.monotonic()
    first = ledger.reserve(unique, "slow", {"tokens": 60}, timeout_s=60)
    assert first.status == "unavailable" and time.monotonic() - started < 1.0
    busy.join()
    retry = ledger.reserve(unique, "slow", {"tokens": 60}, timeout_s=60)
    assert retry.admitted and retry.replayed
    assert admin.read(unique)["tokens"].reserved == 61
    ledger.close()
    admin.close()


def _wait_busy(port: int, timeout_s: float = 10.0) -> None:
    """Return once the server stops answering at once: the busy script is running."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        probe = redis.Redis(
            port=port, socket_connect_timeout=1.0, socket_timeout=0.2, retry=Retry(NoBackoff(), 0)
        )
        try:
            probe.ping()
        except redis.TimeoutError:
            return
        finally:
            probe.close()
    raise AssertionError("the busy script did not start")


def test_scripts_survive_a_flushed_script_cache(own_server: EmbeddedServer, unique: str) -> None:
    """After SCRIPT FLUSH (as after a restart or a failover), every operation still works."""
    ledger = Ledger.from_url(own_server.url)
    ledger.set_ceiling(unique, "tokens", 10)
    ledger.reserve(unique, "a", {"tokens": 5}, timeout_s=60)
    ledger.client.script_flush()
    assert ledger.reserve(unique, "b", {"tokens": 5}, timeout_s=60).admitted
    ledger.client.script_flush()
    assert not ledger.settle(unique, "a", {"tokens": 5}).replayed
    ledger.client.script_flush()
    assert ledger.read(unique)["tokens"].committed == 5
    ledger.close()
