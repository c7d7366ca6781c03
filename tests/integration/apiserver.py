"""The HTTP API as the tests use it: `turnstile api` started as a real uvicorn process on a
free port, an httpx client for it, and keys made the way an operator makes them."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import httpx
import redis

from turnstile.worker.http.apikeys import Role, create

READY_TIMEOUT_S = 30.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ApiServer:
    def __init__(self, redis_url: str, env: Mapping[str, str] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = Path(tempfile.mkdtemp(prefix="turnstile-api-")) / "api.log"
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("TURNSTILE_")},
            "TURNSTILE_REDIS_URL": redis_url,
            "TURNSTILE_API_PORT": str(self.port),
            "TURNSTILE_LOG_FORMAT": "json",
            "TURNSTILE_ALLOW_DRILLS": "1",  # slow tools, as the test workers allow
            "TURNSTILE_API_WEBHOOKS": "false",  # one deliverer at a time: the webhook tests'
            "TURNSTILE_SUBMIT_QUEUES": "*",  # any queue, as the suite's clients (conftest.py)
            **(env or {}),
        }
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> ApiServer:
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-c", "from turnstile.worker.cli.main import main; main()", "api"],
                env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"api exited: {self.log()[-2000:]}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        self.stop()  # a server that never got ready is not left running
        raise RuntimeError(f"api not ready: {self.log()[-2000:]}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)


@contextmanager
def running_api(redis_url: str, env: Mapping[str, str] | None = None) -> Iterator[ApiServer]:
    server = ApiServer(redis_url, env).start()
    try:
        yield server
    finally:
        server.stop()


def make_key(
    redis_url: str, tenant: str, role: Role = Role.SERVICE, name: str | None = None
) -> str:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        return create(client, tenant=tenant, role=role, name=name)[1]
    finally:
        client.close()


def http(server: ApiServer, key: str | None) -> httpx.Client:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.Client(base_url=server.url, headers=headers, timeout=30)


def sse_events(
    client: httpx.Client,
    path: str,
    *,
    last_event_id: str | None = None,
    stop_after: int | None = None,
    until: Callable[[tuple[str, str, str]], bool] | None = None,
    timeout_s: float = 60.0,
) -> list[tuple[str, str, str]]:
    """(id, event, data) of each event on an SSE stream, until the server closes it, or the
    client hangs up after `stop_after` events or after the first event `until` is true of."""
    headers = {"Last-Event-ID": last_event_id} if last_event_id else {}
    out: list[tuple[str, str, str]] = []
    fields: dict[str, str] = {}
    with client.stream("GET", path, headers=headers, timeout=timeout_s) as reply:
        assert reply.status_code == 200, reply.read()
        assert reply.headers["content-type"].startswith("text/event-stream")
        for line in reply.iter_lines():
            if line == "":
                if "data" in fields:
                    out.append((fields.get("id", ""), fields.get("event", ""), fields["data"]))
                    if stop_after is not None and len(out) >= stop_after:
                        return out
                    if until is not None and until(out[-1]):
                        return out
                fields = {}
            elif not line.startswith(":"):
                name, _, value = line.partition(":")
                fields[name] = value.removeprefix(" ")
    return out
