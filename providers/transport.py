"""The HTTP transport under both SDK clients: httpx's, with a connection pool whose cost per
request does not grow with the connections it holds.

httpcore's own pool, on every request sent and every response closed, walks all its requests
and probes every idle connection's socket for a server's close (`has_expired`); on a green
worker each probe is a trip through gevent's hub. With hundreds of turns waiting on a model
at once that walk was a fifth of a model call's CPU. This pool keeps the idle connections of
each origin on a stack: a request takes the one used last and probes only that one; the
connections idle longest, at the bottom, are closed once idle for the keep-alive expiry. The
number of connections open at once is bounded as httpcore's is (`max_connections`, a request
over it waiting up to the pool timeout); idle ones are kept up to that bound, so a green
worker's every turn finds one, and closed after the expiry when the turns are fewer.

Proxies are httpx's as before: a proxy from the environment is mounted by `httpx2.Client`
with its own transport, not this one.
"""

from __future__ import annotations

import contextlib
import ssl
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator

import httpcore2
import httpx2

Key = tuple[bytes, bytes, int]  # an origin: scheme, host, port

# Connections open at once to one endpoint from one process, idle ones included: a green
# worker's most turns in flight (worker/runtime/pools.py's MAX_CONCURRENCY), each making one
# call at a time, so a turn never waits for the pool. The SDKs' own default is 1,000, of which
# they keep 100 idle: a worker with more turns in flight closed and reopened connections.
MAX_CONNECTIONS = 5000
KEEPALIVE_EXPIRY_S = 5.0  # httpx's default: an idle connection is closed after it
# Both SDKs' default timeout: every call of ours passes its own, the run's time left.
TIMEOUT = httpx2.Timeout(timeout=600, connect=5.0)


class StackPool:
    """httpcore's pool interface (`handle_request`, `close`) over a stack of idle connections
    per origin."""

    def __init__(
        self, *, ssl_context: ssl.SSLContext, max_connections: int, keepalive_expiry: float,
    ) -> None:  # fmt: skip
        self._ssl_context = ssl_context
        self._expiry = keepalive_expiry
        self._slots = threading.BoundedSemaphore(max_connections)
        self._lock = threading.Lock()
        self._idle: dict[Key, deque[tuple[float, httpcore2.HTTPConnection]]] = {}
        self._closed = False

    def handle_request(self, request: httpcore2.Request) -> httpcore2.Response:
        scheme = request.url.scheme
        if scheme not in (b"http", b"https"):
            raise httpcore2.UnsupportedProtocol(
                f"Request URL has an unsupported protocol '{scheme.decode()}://'."
            )
        timeouts = request.extensions.get("timeout", {})
        if not self._slots.acquire(timeout=timeouts.get("pool")):
            raise httpcore2.PoolTimeout("no connection of the pool came free in time")
        origin = request.url.origin
        key = (origin.scheme, origin.host, origin.port)
        try:
            while True:
                connection = self._take(key) or httpcore2.HTTPConnection(
                    origin=origin, ssl_context=self._ssl_context, keepalive_expiry=self._expiry
                )
                try:
                    response = connection.handle_request(request)
                except httpcore2.ConnectionNotAvailable:
                    connection.close()
                    continue  # it closed between the probe and the send: another one
                except BaseException:
                    connection.close()
                    raise
                break
        except BaseException:
            self._slots.release()
            raise
        assert isinstance(response.stream, Iterable)
        return httpcore2.Response(
            status=response.status,
            headers=response.headers,
            content=_Returned(response.stream, self, key, connection),
            extensions=response.extensions,
        )

    def _take(self, key: Key) -> httpcore2.HTTPConnection | None:
        """The idle connection used last that is still open, or None; the ones that were
        not are closed."""
        while True:
            with self._lock:
                stack = self._idle.get(key)
                if not stack:
                    return None
                _, connection = stack.pop()
            # One probe: whether the server closed it, or its keep-alive expired.
            if connection.is_available() and not connection.has_expired():
                return connection
            connection.close()

    def give_back(self, key: Key, connection: httpcore2.HTTPConnection) -> None:
        """A response's connection, back on its stack if it may take another request; the
        connections idle past the expiry are closed."""
        stale: list[httpcore2.HTTPConnection] = []  # closed outside the lock
        now = time.monotonic()
        with self._lock:
            stack = self._idle.setdefault(key, deque())
            if connection.is_idle() and not self._closed:
                stack.append((now, connection))
            else:
                stale.append(connection)
            while stack and now - stack[0][0] > self._expiry:
                stale.append(stack.popleft()[1])
        self._slots.release()
        for old in stale:
            old.close()

    def idle(self) -> list[httpcore2.HTTPConnection]:
        """The idle connections, the one used last first."""
        with self._lock:
            return [c for stack in self._idle.values() for _, c in reversed(stack)]

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle = [c for stack in self._idle.values() for _, c in stack]
            self._idle.clear()
        for connection in idle:
            connection.close()

    def __enter__(self) -> StackPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Returned:
    """A response's body: when it is closed, its connection goes back to the pool."""

    def __init__(
        self, stream: Iterable[bytes], pool: StackPool, key: Key,
        connection: httpcore2.HTTPConnection,
    ) -> None:  # fmt: skip
        self._stream, self._pool, self._key, self._connection = stream, pool, key, connection
        self._closed = False

    def __iter__(self) -> Iterator[bytes]:
        yield from self._stream

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            close = getattr(self._stream, "close", None)
            if close is not None:
                close()
        finally:
            self._pool.give_back(self._key, self._connection)


class StackTransport(httpx2.HTTPTransport):
    """httpx's transport (its request and response mapping, its errors) on a `StackPool`."""

    def __init__(self, limits: httpx2.Limits) -> None:
        super().__init__(limits=limits)
        self.pool = StackPool(
            ssl_context=httpx2.create_ssl_context(),
            max_connections=limits.max_connections or MAX_CONNECTIONS,
            keepalive_expiry=limits.keepalive_expiry or KEEPALIVE_EXPIRY_S,
        )
        self._pool = self.pool  # type: ignore[assignment]


class _Client(httpx2.Client):
    """Closes its connections when dropped, as the SDKs' own client does: `sdk.py`'s cache
    lets go of a client for an endpoint no longer used."""

    def __del__(self) -> None:
        if self.is_closed:
            return
        with contextlib.suppress(Exception):  # nothing to tell at collection time
            self.close()


def http_client() -> httpx2.Client:
    """An httpx client as the SDKs make theirs (their timeout, redirects followed), on a
    `StackTransport`."""
    limits = httpx2.Limits(
        max_connections=MAX_CONNECTIONS, max_keepalive_connections=MAX_CONNECTIONS,
        keepalive_expiry=KEEPALIVE_EXPIRY_S,
    )  # fmt: skip
    return _Client(
        transport=StackTransport(limits), limits=limits, timeout=TIMEOUT, follow_redirects=True
    )
