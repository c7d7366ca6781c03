"""Webhook receivers for the tests: real HTTP servers on free ports, on threads of the test
process, that answer as told and keep what they got (and when); a TCP server that accepts and
never answers; and the deliverer's fast timers."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

FAST = {
    "TURNSTILE_API_WEBHOOKS": "true",
    "TURNSTILE_API_WEBHOOK_TICK_S": "0.1",
    "TURNSTILE_API_WEBHOOK_BACKOFF_BASE_S": "0.3",
    "TURNSTILE_API_WEBHOOK_TIMEOUT_S": "2",
    # The receivers listen on loopback, which a webhook reaches only through the allow-list.
    "TURNSTILE_API_WEBHOOK_ALLOW": "127.0.0.1",
}


@dataclass
class Receiver:
    """A webhook receiver on `host` (and `port`, or a free one): answers `fail_first`
    requests with 500, then 200 (or never, when `hang`; or a 307 to `redirect`), and keeps
    every request it got."""

    fail_first: int = 0
    hang: bool = False
    host: str = "127.0.0.1"
    port: int = 0
    redirect: str = ""
    got: list[tuple[dict[str, str], bytes]] = field(default_factory=list)
    at: list[float] = field(default_factory=list)  # when each request came (time.time())
    released: threading.Event = field(default_factory=threading.Event)
    server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://{self.host}:{self.server.server_address[1]}/hook"

    def bodies(self, kind: str | None = None) -> list[dict[str, Any]]:
        out = [json.loads(body) for _, body in list(self.got)]
        return [b for b in out if kind is None or b["type"] == kind]


@contextmanager
def receiving(receiver: Receiver) -> Iterator[Receiver]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", "0")))
            receiver.at.append(time.time())
            receiver.got.append(({k.lower(): v for k, v in self.headers.items()}, body))
            if receiver.hang:
                receiver.released.wait(60)
                return
            failing = len(receiver.got) <= receiver.fail_first
            self.send_response(307 if receiver.redirect else 500 if failing else 200)
            if receiver.redirect:
                self.send_header("location", receiver.redirect)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    receiver.server = ThreadingHTTPServer((receiver.host, receiver.port), Handler)
    receiver.server.daemon_threads = True
    thread = threading.Thread(target=receiver.server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        receiver.released.set()
        receiver.server.shutdown()
        receiver.server.server_close()


@dataclass
class Hanging:
    """An endpoint that never answers: a TCP server on `port` (or a free one) that accepts
    every connection, reads nothing and answers nothing, and keeps when each came."""

    port: int = 0
    accepted: list[float] = field(default_factory=list)  # time.time() of each connection
    sock: socket.socket | None = None

    @property
    def port_taken(self) -> int:
        assert self.sock is not None
        return int(self.sock.getsockname()[1])

    def url(self, path: str = "hook") -> str:
        return f"http://127.0.0.1:{self.port_taken}/{path}"


@contextmanager
def hanging(server: Hanging) -> Iterator[Hanging]:
    server.sock = socket.create_server(("127.0.0.1", server.port), backlog=512)
    server.sock.settimeout(0.1)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        assert server.sock is not None
        while not stop.is_set():
            try:
                conn, _ = server.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            server.accepted.append(time.time())
            held.append(conn)

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        stop.set()
        thread.join(5)
        for conn in held:
            conn.close()
        server.sock.close()
