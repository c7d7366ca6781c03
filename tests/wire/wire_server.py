"""A provider's HTTP endpoint in a process of its own, answering from recorded exchanges.

    python -m tests.wire.wire_server SCRIPT.json [DELAY_S] [by-turn|in-order] [CHUNK_DELAY_S]

It serves `POST /v1/chat/completions` (OpenAI) and `POST /v1/messages` (Anthropic): each request
takes the next exchange of the script, a JSON list of {"status", "headers", "body", "delay_s",
"cut"},
and is answered with exactly that status, those headers and that body, after the delay (the
exchange's own, else DELAY_S); a `cut` exchange sends half its body and closes. A request that
asks to stream (`"stream": true`) gets a 200 body in its format's streaming wire format, a frame
every CHUNK_DELAY_S (streaming.py; `cut`, `no_usage`, `malformed` spoil it). A script that
is an object instead is `{"always": EXCHANGE}`, that exchange for every request (a provider
that is down), or `{"agent": {...}}`, replies made from each request for any job (agent.py). The
requests it received are served back at `GET /_requests`, with the time each arrived, so a test
can check what the SDK sent and how long it waited between attempts. It prints its port on the
first line of its output.

An object script may also carry `"rpm": N`: the server then keeps a provider's rate limit of N
requests a minute, as a token bucket (Anthropic documents theirs as one): N at once, refilled
continuously at N a minute; or, with `"window": "sliding"` beside it, as a sliding window: at
most N requests answered in any 60 s. A request beyond it is answered 429 with `retry-after`
(whole seconds) and `retry-after-ms`, the wait until a request may go again, and is listed
at `/_requests` with `"limited": true`.
"""

from __future__ import annotations

import json
import math
import sys
import threading
import time
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tests.wire import streaming
from tests.wire.agent import Agent

ENDPOINTS = ("/v1/chat/completions", "/v1/messages")


def turn_of(body: Any) -> int:
    """Which turn of its run an OpenAI request is, read from the run's view (the user message):
    0 before a plan, then one more for each plan step done."""
    try:
        view = json.loads(body["messages"][1]["content"])
        plan = view["plan"]
    except (KeyError, IndexError, TypeError, ValueError):
        return 0
    return 1 + sum(step["status"] == "done" for step in plan) if plan else 0


class Bucket:
    """The provider's rate limit: `rpm` requests at once, refilled at `rpm` a minute."""

    def __init__(self, rpm: int) -> None:
        self.rpm, self.level, self.at = rpm, float(rpm), time.monotonic()

    def take(self) -> float | None:
        """None if a request may go now (it is counted), else the seconds to wait."""
        now = time.monotonic()
        self.level = min(self.rpm, self.level + (now - self.at) * self.rpm / 60)
        self.at = now
        if self.level >= 1:
            self.level -= 1
            return None
        return (1 - self.level) * 60 / self.rpm


class Window:
    """The provider's rate limit as a sliding window: at most `rpm` requests answered in any
    60 s, each counted from when it arrived."""

    def __init__(self, rpm: int) -> None:
        self.rpm, self.answered = rpm, deque[float]()

    def take(self) -> float | None:
        """None if a request may go now (it is counted), else the seconds to wait."""
        now = time.monotonic()
        while self.answered and self.answered[0] <= now - 60:
            self.answered.popleft()
        if len(self.answered) < self.rpm:
            self.answered.append(now)
            return None
        return self.answered[0] + 60 - now


def limited(wait_s: float) -> dict[str, Any]:
    """A 429 as OpenAI words it, asking for the wait."""
    body = {"error": {"message": f"Rate limit reached for requests; try again in {wait_s:.3f}s",
                      "type": "requests", "code": "rate_limit_exceeded"}}  # fmt: skip
    headers = {
        "retry-after": str(math.ceil(wait_s)),
        "retry-after-ms": str(math.ceil(wait_s * 1000)),
    }
    return {"status": 429, "headers": headers, "body": body, "delay_s": 0}


class Script:
    """The exchanges in order; or, `by_turn`, each request answered by the exchange of its
    run's turn, so that many runs can share one server at once (the benchmarks)."""

    def __init__(
        self, exchanges: Any, delay_s: float = 0.0, *, by_turn: bool = False,
        chunk_delay_s: float = 0.0,
    ) -> None:  # fmt: skip
        self.exchanges: list[dict[str, Any]] = exchanges if isinstance(exchanges, list) else []
        self.always: dict[str, Any] | None = None
        self.agent: Agent | None = None
        rpm = exchanges.get("rpm") if isinstance(exchanges, dict) else None
        sliding = isinstance(exchanges, dict) and exchanges.get("window") == "sliding"
        self.bucket = (Window(int(rpm)) if sliding else Bucket(int(rpm))) if rpm else None
        if isinstance(exchanges, dict) and "always" in exchanges:
            self.always = exchanges["always"]
        elif isinstance(exchanges, dict):
            self.agent = Agent.of(exchanges["agent"])
        self.delay_s, self.by_turn = delay_s, by_turn
        self.chunk_delay_s = chunk_delay_s
        self.received: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    def take(
        self, path: str, body: Any, headers: dict[str, str]
    ) -> tuple[dict[str, Any] | None, dict[str, Any]]:
        """The exchange that answers the request, and its record at /_requests."""
        with self.lock:
            wait_s = self.bucket.take() if self.bucket is not None else None
            if wait_s is not None:
                self.received.append({"path": path, "t": time.monotonic(), "limited": True})
                return limited(wait_s), self.received[-1]
            if self.always is not None or self.agent is not None:
                number = len(self.received) + 1
                self.received.append(
                    {"path": path, "body": body, "headers": headers, "t": time.monotonic()}
                )
                if self.always is not None:
                    return self.always, self.received[-1]
                assert self.agent is not None
                reply = {"status": 200, "body": self.agent.reply(path, body, number)}
                return reply, self.received[-1]
            index = turn_of(body) if self.by_turn else len(self.received)
            if self.by_turn:  # thousands of requests: their count, not their bodies
                streams = isinstance(body, dict) and bool(body.get("stream"))
                self.received.append({"path": path, "t": time.monotonic(), "stream": streams})
            else:
                self.received.append(
                    {"path": path, "body": body, "headers": headers, "t": time.monotonic()}
                )
            found = self.exchanges[index] if index < len(self.exchanges) else None
            return found, self.received[-1]


def stream(
    handler: BaseHTTPRequestHandler, script: Script, frames: list[bytes],
    exchange: dict[str, Any], record: dict[str, Any],
) -> None:  # fmt: skip
    """Stream frames chunked, each `chunk_delay_s` after the one before; a `cut` exchange's
    connection closes mid-body. Each frame's send time (wall clock) is kept for /_requests
    as `sent`."""
    cut = exchange.get("cut")
    delay_s = float(exchange.get("chunk_delay_s", script.chunk_delay_s))
    handler.send_response(200)
    handler.send_header("content-type", "text/event-stream")
    handler.send_header("transfer-encoding", "chunked")
    handler.end_headers()
    sent: list[float] = []
    with script.lock:
        record["sent"] = sent
    try:
        for frame in frames:
            if delay_s:
                time.sleep(delay_s)
            handler.wfile.write(b"%x\r\n%s\r\n" % (len(frame), frame))
            handler.wfile.flush()
            sent.append(time.time())
        if not cut:
            handler.wfile.write(b"0\r\n\r\n")
    except (BrokenPipeError, ConnectionResetError):
        return
    handler.close_connection = bool(cut)


def respond(
    handler: Any, script: Script, path: str, body: Any, *, exchange: dict[str, Any],
    record: dict[str, Any],
) -> None:  # fmt: skip
    """The exchange's answer: streamed when the request asked to stream, cut, or whole."""
    if isinstance(body, dict) and body.get("stream") and int(exchange["status"]) == 200:
        stream(handler, script, streaming.frames(path, exchange, body), exchange, record)
    elif exchange.get("cut"):
        handler._cut(int(exchange["status"]), exchange["body"])
    else:
        try:
            handler._send(int(exchange["status"]), exchange["body"], exchange.get("headers"))
        except (BrokenPipeError, ConnectionResetError):
            return  # the client gave up waiting: what a hung provider looks like to it


def handler(script: Script) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        # A reply's headers and body are two writes: without this, the second waited for the
        # client's delayed ACK of the first (40 ms a reply on Linux), which no provider does.
        disable_nagle_algorithm = True

        def log_message(self, format: str, *args: Any) -> None:
            return

        def _send(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)

        def _cut(self, status: int, body: Any) -> None:
            """Half the body, then the connection closes: a reply cut in transit."""
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data[: len(data) // 2])
            self.wfile.flush()
            self.close_connection = True

        def do_GET(self) -> None:
            if self.path == "/_requests":
                with script.lock:
                    self._send(200, script.received)
            else:
                self._send(404, {"error": {"message": "not found", "type": "not_found"}})

        def do_POST(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            body = json.loads(self.rfile.read(length) or b"null")
            path = self.path.split("?")[0]
            if path not in ENDPOINTS:
                self._send(404, {"error": {"message": f"no route {path}", "type": "not_found"}})
                return
            keys = ("authorization", "x-api-key", "x-stainless-retry-count", "anthropic-version")
            seen = {k: v for k, v in self.headers.items() if k.lower() in keys}
            exchange, record = script.take(path, body, seen)
            if exchange is None:
                self._send(500, {"error": {"message": "the script has no more exchanges"}})
                return
            time.sleep(float(exchange.get("delay_s", script.delay_s)))
            respond(self, script, path, body, exchange=exchange, record=record)

    return Handler


class Server(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that closed its connection (an SDK done with a stream before its last
        empty chunk) is not an error of the server's."""
        if isinstance(sys.exc_info()[1], ConnectionResetError | BrokenPipeError):
            return
        super().handle_error(request, client_address)


def main() -> None:
    delay_s = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
    by_turn = len(sys.argv) > 3 and sys.argv[3] == "by-turn"
    chunk_delay_s = float(sys.argv[4]) if len(sys.argv) > 4 else 0.0
    script = Script(json.loads(Path(sys.argv[1]).read_text()), delay_s, by_turn=by_turn,
                    chunk_delay_s=chunk_delay_s)  # fmt: skip
    Server.request_queue_size = 1024  # hundreds of calls connect at once
    server = Server(("127.0.0.1", 0), handler(script))
    server.daemon_threads = True
    print(server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
