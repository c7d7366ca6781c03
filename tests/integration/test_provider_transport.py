"""The providers' HTTP transport (providers/transport.py) against the wire server, a real HTTP
server process: connections kept and reused one at a time, the one used last first, a
connection the server closed or left half-read never reused, the bound on connections open at
once kept, and the idle ones closed after the keep-alive expiry."""

from __future__ import annotations

import threading
import time

import httpx2
import pytest

from tests.wire.wire import Wire, wire_server
from turnstile.providers.transport import StackTransport

pytestmark = pytest.mark.integration


def _client(**limits: float) -> tuple[httpx2.Client, StackTransport]:
    transport = StackTransport(httpx2.Limits(**limits))  # type: ignore[arg-type]
    return httpx2.Client(transport=transport, timeout=10), transport


def _requests(wire: Wire) -> str:
    return f"http://127.0.0.1:{wire.port}/_requests"


def test_calls_one_at_a_time_reuse_one_connection_and_at_once_each_get_one() -> None:
    """Calls in sequence go on one kept connection; calls at once each take one of their own,
    all kept after; the next call takes the one given back last."""
    with wire_server("openai", "support_run") as wire:
        client, transport = _client(max_connections=50, keepalive_expiry=30)
        with client:
            for _ in range(3):
                assert client.get(_requests(wire)).status_code == 200
            (kept,) = transport.pool.idle()
            assert client.get(_requests(wire)).status_code == 200
            assert transport.pool.idle() == [kept]

            go = threading.Barrier(6)

            def call() -> None:
                go.wait()
                with client.stream("GET", _requests(wire)) as reply:
                    go.wait()  # all six hold a connection at once
                    reply.read()

            threads = [threading.Thread(target=call) for _ in range(6)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            idle = transport.pool.idle()
            assert len(idle) == 6 and kept in idle
            assert client.get(_requests(wire)).status_code == 200
            assert transport.pool.idle()[0] is idle[0]  # the last given back, taken and back


def test_a_connection_cut_or_closed_by_the_server_is_not_reused() -> None:
    """A reply cut mid-body fails the call and its connection is dropped; one the server
    closed while idle is found so when taken and a new one is opened."""
    cut = {"always": {"status": 200, "body": {"x": "y" * 200}, "cut": True}}
    with wire_server("openai", script=cut) as wire:
        client, transport = _client(max_connections=50, keepalive_expiry=30)
        with client:
            url = f"http://127.0.0.1:{wire.port}/v1/chat/completions"
            with pytest.raises(httpx2.RemoteProtocolError):
                client.post(url, json={})
            assert transport.pool.idle() == []
            assert client.get(_requests(wire)).status_code == 200
            (kept,) = transport.pool.idle()
            kept.close()  # closed while idle
            assert client.get(_requests(wire)).status_code == 200
            assert transport.pool.idle()[0] is not kept


def test_the_bound_on_connections_is_kept_and_idle_ones_expire() -> None:
    """A call over `max_connections` in flight waits for one to come back, up to the pool
    timeout; a connection idle past the keep-alive expiry is closed, not reused."""
    with wire_server("openai", "support_run") as wire:
        client, transport = _client(max_connections=1, keepalive_expiry=0.2)
        with client:
            with client.stream("GET", _requests(wire)) as held:
                started = time.monotonic()
                with pytest.raises(httpx2.PoolTimeout):
                    client.get(_requests(wire), timeout=httpx2.Timeout(10, pool=0.3))
                assert time.monotonic() - started >= 0.3
                held.read()
            (first,) = transport.pool.idle()
            time.sleep(0.3)
            assert client.get(_requests(wire)).status_code == 200
            assert transport.pool.idle()[0] is not first
            assert first.is_closed()
