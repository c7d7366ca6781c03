"""RabbitMQ for the tests: the server's URL (RabbitMQ 3 at 127.0.0.1:5672, guest/guest, or
TURNSTILE_TEST_AMQP_URL), why it cannot be used if it cannot, queues of a test's own that are
deleted after it (never another's), and a TCP proxy a test can cut to take the broker away
from a worker without touching the server."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from kombu import Connection

from turnstile.worker.broker import amqp, layout
from turnstile.worker.dev.embedded import EmbeddedServer

AMQP_URL = os.environ.get("TURNSTILE_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")


def unreachable() -> str | None:
    """Why the tests' RabbitMQ cannot be used, in one line; None when it can."""
    try:
        amqp.check(AMQP_URL, timeout_s=3.0)
    except amqp.BrokerError as exc:
        return f"RabbitMQ not reachable ({exc}); these tests use RabbitMQ 3 at 127.0.0.1:5672"
    return None


def delete_queues(*names: str, url: str = AMQP_URL) -> None:
    """Delete these Turnstile queues on the broker (by their broker names, and by the names
    themselves, as queues were named before their namespace) and the exchanges named after
    them (Celery declares one per queue); the ones that are not there are skipped."""
    with Connection(url, connect_timeout=5) as conn:
        for name in (n for queue in names for n in (layout.broker_queue(queue), queue)):
            for delete in ("queue_delete", "exchange_delete"):
                channel: Any = conn.channel()
                try:
                    getattr(channel, delete)(name)
                except Exception:  # noqa: S112 - not there: nothing to delete
                    continue
                finally:
                    with contextlib.suppress(Exception):
                        channel.close()


@contextlib.contextmanager
def own_queues(*names: str) -> Iterator[tuple[str, ...]]:
    """Queues of this test's own on the tests' RabbitMQ, deleted afterwards."""
    try:
        yield names
    finally:
        delete_queues(*names)


class TcpProxy:
    """A TCP proxy on a free local port to `upstream`, in threads: `cut` closes the listening
    socket and every connection through it (the worker sees its broker vanish), `restore`
    listens again on the same port."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.port = 0
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._listener: socket.socket | None = None
        self.restore()

    def url(self, amqp_url: str = AMQP_URL) -> str:
        """The AMQP URL through the proxy: the same user, password and vhost."""
        scheme, rest = amqp_url.split("://", 1)
        creds, _, tail = rest.rpartition("@")
        path = tail.split("/", 1)[1] if "/" in tail else ""
        return f"{scheme}://{creds}@127.0.0.1:{self.port}/{path}"

    def restore(self) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self.port = listener.getsockname()[1]
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def cut(self) -> None:
        with self._lock:
            listener, self._listener = self._listener, None
            doomed = set(self._sockets)
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        for sock in doomed:  # each pair's thread closes its sockets once both ends stop
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.cut()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # cut
            try:
                server = socket.create_connection(self.upstream, timeout=5)
                server.settimeout(None)
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._listener is not listener:  # cut meanwhile
                    client.close()
                    server.close()
                    return
                self._sockets |= {client, server}
            threading.Thread(target=self._pair, args=(client, server), daemon=True).start()

    def _pair(self, client: socket.socket, server: socket.socket) -> None:
        back = threading.Thread(target=self._pump, args=(server, client), daemon=True)
        back.start()
        self._pump(client, server)
        back.join()
        with self._lock:
            self._sockets -= {client, server}
        client.close()
        server.close()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def __enter__(self) -> TcpProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


BROKERS = ("redis", "amqp")


@contextlib.contextmanager
def broker_for(kind: str, redis_url: str, *queues: str) -> Iterator[tuple[str, str | None]]:
    """(store URL, broker URL) for a test parametrized over BROKERS: the suite's store with
    its own Redis as the broker (None), or RabbitMQ, whose `queues` are deleted afterwards,
    with a store of the test's own (a worker's dispatcher serves every queue of its store: one
    on RabbitMQ must not take the steps of the Redis-broker tests sharing the suite's store);
    skipped with one line when RabbitMQ is not reachable."""
    if kind == "redis":
        yield redis_url, None
        return
    reason = unreachable()
    if reason is not None:
        pytest.skip(reason)
    with own_queues(*queues), EmbeddedServer() as store:
        yield store.url, AMQP_URL
