"""`turnstile dev-server` as a developer runs it, a process of its own: it prints the line to
export, serves a store a client submits to, stops on Ctrl-C (SIGINT) or SIGTERM with its data
kept in its folder for the next start, and says in one line when its port is taken."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.integration.workers import client_for
from turnstile.jobs.support.scenarios import GOAL, USER
from turnstile.worker.dev.devserver import DEFAULT_DIR, DEFAULT_PORT
from turnstile.worker.dev.embedded import EmbeddedServer, free_port

pytestmark = pytest.mark.integration

TURNSTILE = str(Path(sys.executable).parent / "turnstile")
STOP_TIMEOUT_S = 30
# The command as a terminal starts it in the foreground: with Ctrl-C (SIGINT) at its default.
# A suite run as a background job of a shell without job control has SIGINT ignored, which a
# child inherits and Python keeps, and the Ctrl-C these tests send would then do nothing.
FOREGROUND = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "os.execv(sys.argv[1], sys.argv[1:])"
)


def _command(cwd: Path, *args: str, **env: str) -> subprocess.Popen[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("TURNSTILE_")}
    return subprocess.Popen(
        [sys.executable, "-c", FOREGROUND, TURNSTILE, "dev-server", *args], cwd=cwd,
        env={**base, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip


@contextmanager
def dev_server(cwd: Path, *args: str, **env: str) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """The command started in `cwd`, yielded with the URL its export line names once it has
    printed it; killed at the end if the test did not stop it."""
    process = _command(cwd, *args, **env)
    try:
        assert process.stdout is not None
        first = process.stdout.readline()
        export = process.stdout.readline()
        assert first.startswith("Valkey on 127.0.0.1:"), first
        assert export.startswith("export TURNSTILE_REDIS_URL=redis://127.0.0.1:"), export
        yield process, export.strip().removeprefix("export TURNSTILE_REDIS_URL=")
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(STOP_TIMEOUT_S)
        for stream in (process.stdout, process.stderr):
            if stream is not None:
                stream.close()


def _stop(process: subprocess.Popen[str], how: signal.Signals) -> str:
    """Send `how`; the rest of what the command printed, once it has exited 0."""
    process.send_signal(how)
    assert process.wait(STOP_TIMEOUT_S) == 0
    assert process.stdout is not None and process.stderr is not None
    said, errors = process.stdout.read(), process.stderr.read()
    assert "Traceback" not in errors, errors
    return said


def test_the_dev_server_serves_a_store_and_keeps_its_data_in_its_folder(
    tmp_path: Path, unique: str
) -> None:
    """Started with --port and --dir, it prints the export line for that port; a run submitted
    to it is there again after a Ctrl-C (SIGINT) and a start over the same folder, which holds
    its append-only file; SIGTERM stops it as cleanly."""
    port, folder = free_port(), tmp_path / "store"
    with dev_server(tmp_path, "--port", str(port), "--dir", str(folder)) as (process, url):
        assert url == f"redis://127.0.0.1:{port}/0"
        run_id = client_for(url).submit(f"t-{unique}", USER, "support", GOAL, queue=f"q-{unique}")
        said = _stop(process, signal.SIGINT)
    assert f"stopped; its data stays in {folder}" in said
    assert any((folder / "appendonlydir").iterdir())
    with dev_server(tmp_path, "--port", str(port), "--dir", str(folder)) as (process, url):
        assert client_for(url).state(run_id).goal == GOAL
        _stop(process, signal.SIGTERM)
    assert not _listening(port)


def test_the_default_folder_is_in_the_current_directory(tmp_path: Path) -> None:
    """Without --dir its data goes to .turnstile/valkey under the directory it runs in (6379
    is the default port; TURNSTILE_DEV_SERVER_PORT sets it as --port does)."""
    assert (6379, Path(".turnstile/valkey")) == (DEFAULT_PORT, DEFAULT_DIR)
    port = free_port()
    with dev_server(tmp_path, TURNSTILE_DEV_SERVER_PORT=str(port)) as (process, url):
        assert url == f"redis://127.0.0.1:{port}/0"
        said = _stop(process, signal.SIGINT)
    assert f"stopped; its data stays in {tmp_path / '.turnstile' / 'valkey'}" in said
    assert (tmp_path / ".turnstile" / "valkey" / "appendonlydir").is_dir()


def _listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.slow  # over 10 s on 2 cores: CI runs it in the slow part
def test_a_taken_port_is_one_line(tmp_path: Path) -> None:
    """A port another program holds, or a Redis/Valkey server answers on: one line saying so
    and what to do (for a server, the line that uses it), exit 1, nothing started."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        result = _command(tmp_path, "--port", str(port)).communicate(timeout=STOP_TIMEOUT_S)
    assert result == ("", f"error: port {port} on 127.0.0.1 is taken (Address already in use): "
                          "pass --port to use another\n")  # fmt: skip
    with EmbeddedServer() as server:
        taken = _command(tmp_path, "--port", str(server.port))
        out, err = taken.communicate(timeout=STOP_TIMEOUT_S)
    assert taken.returncode == 1 and out == "" and err.count("\n") == 1, err
    assert err.startswith(f"error: port {server.port} is taken: a Redis or Valkey server")
    assert f"export TURNSTILE_REDIS_URL=redis://127.0.0.1:{server.port}/0" in err
    assert not (tmp_path / ".turnstile").exists()
