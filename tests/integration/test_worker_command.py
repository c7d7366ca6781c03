"""`turnstile worker` as an operator runs it: real processes of the command itself, each a
Celery worker with its own node name, whose exit status a supervisor can trust, and which
rides out restarts of its server."""

from __future__ import annotations

import functools
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.integration.workers import WorkerProcess, client_for, settled, stop_all, wait_until
from turnstile.errors import StoreUnavailableError
from turnstile.jobs.support.scenarios import GOAL, USER
from turnstile.worker.broker.producer import producer
from turnstile.worker.cli.main import app
from turnstile.worker.dev.embedded import EmbeddedServer, free_port
from turnstile.worker.settings import Settings

pytestmark = pytest.mark.integration

TURNSTILE = str(Path(sys.executable).parent / "turnstile")


def command_worker(redis_url: str, *args: str, env: dict[str, str] | None = None) -> WorkerProcess:
    """A `turnstile worker` process (in place of `celery worker`), with the test workers'
    environment and log."""
    worker = WorkerProcess(redis_url, ["default"], name=f"cmd-{uuid.uuid4().hex[:8]}", env=env)
    worker.args = [TURNSTILE, "worker", "--redis-url", redis_url, "-c", "1", *args]
    return worker.start()


def popen(worker: WorkerProcess) -> subprocess.Popen[bytes]:
    assert worker.process is not None
    return worker.process


@contextmanager
def command_workers(
    redis_url: str, *argss: list[str], env: dict[str, str] | None = None
) -> Iterator[list[WorkerProcess]]:
    """One `turnstile worker` per argument list, ready when yielded, stopped after."""
    workers = [command_worker(redis_url, *args, env=env) for args in argss]
    try:
        for worker in workers:
            worker.wait_ready()
        yield workers
    finally:
        stop_all(workers)


def pong_names(redis_url: str, names: list[str]) -> set[str]:
    replies = producer(Settings(redis_url=redis_url)).control.ping(destination=names, timeout=2.0)
    return {name for reply in replies or [] for name in reply}


@pytest.mark.slow  # over 10 s on 2 cores: CI runs it in the slow part
def test_two_workers_on_one_machine_are_two_nodes(unique: str) -> None:
    """Without --name each worker is turnstile-<pid>@<host>, so two on one machine both answer
    a ping under their own names; --name and TURNSTILE_WORKER_NAME set it."""
    host = socket.gethostname()
    with EmbeddedServer() as server:
        queue = f"names-{unique}"
        named = ["-Q", queue, "--name", f"billing-{unique}"]
        with command_workers(server.url, ["-Q", queue], ["-Q", queue], named) as (a, b, _):
            expected = [f"turnstile-{popen(a).pid}@{host}", f"turnstile-{popen(b).pid}@{host}",
                        f"billing-{unique}@{host}"]  # fmt: skip
            wait_until(lambda: pong_names(server.url, expected) == set(expected),
                       timeout_s=20, what="three nodes answer")  # fmt: skip
        by_env = f"env-{unique}@box"
        with command_workers(server.url, ["-Q", queue], env={"TURNSTILE_WORKER_NAME": by_env}):
            wait_until(lambda: pong_names(server.url, [by_env]) == {by_env}, timeout_s=20,
                       what="the node named by the environment")  # fmt: skip


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--name", "two@at@signs"], "bad worker name"),
        (["--name", "has space"], "bad worker name"),
        (["--queues", "a,,b"], "bad --queues"),
        (["--loglevel", "LOUD"], "bad --loglevel"),
        (["--concurrency", "0"], "bad --concurrency"),
        (["--concurrency", "5000"], "bad --concurrency"),
        (["--concurrency", "-3"], "bad --concurrency"),
        (["--pool", "gevent", "--concurrency", "0"], "bad --concurrency"),
        (["--pool", "gevent", "--concurrency", "6000"], "bad --concurrency"),
        (["--pool", "fork"], "bad --pool 'fork'"),
        (["--pool", "threads"], "--pool threads cannot stop a call that ignores its timeout"),
        (["TURNSTILE_POOL", "threads"], "--pool threads cannot stop a call"),
        (["TURNSTILE_MAX_STEP_ATTEMPTS", "0"], "bad TURNSTILE_MAX_STEP_ATTEMPTS"),
        (["TURNSTILE_ALLOW_DRILLS", "perhaps"], "bad TURNSTILE_ALLOW_DRILLS"),
        (["TURNSTILE_EAGER_TURNS", "-1"], "bad TURNSTILE_EAGER_TURNS"),
        (["TURNSTILE_EAGER_TURNS", "1.5"], "bad TURNSTILE_EAGER_TURNS"),
        (["TURNSTILE_EAGER_TURNS", "many"], "bad TURNSTILE_EAGER_TURNS"),
    ],
)
def test_bad_worker_options_are_one_line(args: list[str], message: str) -> None:
    """A bad option or setting of `turnstile worker` is one line and exit 2, before any worker
    starts."""
    env = {"TURNSTILE_REDIS_URL": "redis://x"}
    if args[0].startswith("TURNSTILE_"):
        env, args = {**env, args[0]: args[1]}, []
    result = CliRunner().invoke(app, ["worker", *args], env=env)
    assert result.exit_code == 2, result.output
    assert message in result.stderr and result.stderr.count("\n") == 1, result.stderr


def test_the_worker_command_exits_with_the_status_of_its_shutdown(
    redis_url: str, unique: str
) -> None:
    """A cold shutdown (SIGQUIT: running turns are cut short) exits non-zero, so a supervisor
    sees a failure and restarts the worker; a warm one (SIGTERM) exits 0."""
    with command_workers(redis_url, ["-Q", f"x-{unique}"], ["-Q", f"y-{unique}"]) as (a, b):
        popen(a).send_signal(signal.SIGQUIT)
        popen(b).send_signal(signal.SIGTERM)
        assert popen(a).wait(30) == 1, a.log()[-2000:]
        assert popen(b).wait(30) == 0, b.log()[-2000:]


def _progress(redis_url: str, runs: list[str]) -> int:
    """Committed versions over the runs; -1 while the server is not answering."""
    try:
        client = client_for(redis_url)
        return sum(int(client.run_hash(r)[1]["version"]) for r in runs)
    except StoreUnavailableError:  # what the client says of a server that is not answering
        return -1


def _advanced(redis_url: str, runs: list[str], since: int) -> bool:
    return _progress(redis_url, runs) > since


def test_a_worker_rides_out_restarts_of_its_server(unique: str) -> None:
    """The server that is both broker and store restarts three times while turns are in
    flight: the worker stays up (or exits non-zero for its supervisor), and every run ends
    `completed` with its refund made once."""
    with EmbeddedServer(appendonly=True) as server:
        queue = f"restart-{unique}"
        with command_workers(server.url, ["-Q", queue, "-c", "2"]) as (worker,):
            # A step popped off the queue as the server stops is lost with its reply: the
            # sweeper sends it again when its lease lapses (3 s here, as the workers' FAST).
            client = client_for(server.url, pickup_lease_s=3)
            slow = {"sleep_s": {"get_order": 0.3, "issue_refund": 0.3}}
            runs = [client.submit("t", USER, "support", GOAL, slow, queue=queue) for _ in range(6)]
            seen = _progress(server.url, runs)
            for _ in range(3):
                wait_until(functools.partial(_advanced, server.url, runs, seen), timeout_s=60,
                           what="a turn committed since the last restart")  # fmt: skip
                server.stop()
                server.start()
                seen = max(seen, _progress(server.url, runs))
                code = popen(worker).poll()
                assert code is None or code != 0, worker.log()[-3000:]
            wait_until(lambda: settled(client_for(server.url), runs), timeout_s=120,
                       what="every run ends after the restarts")  # fmt: skip
            assert popen(worker).poll() is None, worker.log()[-3000:]
            client = client_for(server.url)
            assert {client.state(r).outcome for r in runs} == {"completed"}
            assert "AttributeError" not in worker.log()


START_WAIT_MARGIN_S = 60  # beyond its start wait, what a loaded machine may take to say so


def _no_store_worker(*args: str, **env: str) -> tuple[subprocess.CompletedProcess[str], float]:
    """`turnstile worker` as its own process, with the environment given; its result and how
    long it ran."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("TURNSTILE_")}
    started = time.monotonic()
    result = subprocess.run(
        [TURNSTILE, "worker", "-Q", "q", *args], env={**base, **env}, capture_output=True,
        text=True, timeout=START_WAIT_MARGIN_S + 30, check=False,
    )  # fmt: skip
    return result, time.monotonic() - started


def test_a_worker_with_no_store_says_so_in_one_line_and_exits_after_its_wait() -> None:
    """`turnstile worker` pointed at a store that is not there waits --start-wait-s, then
    prints one line naming the store (password hidden) and `turnstile dev-server`, and exits
    1: no Celery banner, no retries naming the transport."""
    port = free_port()
    url = f"redis://:hunter2@127.0.0.1:{port}/0"
    result, took_s = _no_store_worker("--redis-url", url, "--start-wait-s", "3")
    assert result.returncode == 1, result.stderr[-2000:]
    assert 3 <= took_s < 3 + START_WAIT_MARGIN_S
    assert result.stdout == "" and result.stderr.count("\n") == 1, result.stderr[-2000:]
    line = result.stderr
    assert line.startswith(
        f"error: the store at redis://:***@127.0.0.1:{port}/0 did not answer within 3 s ("
    ), line
    assert "start one with `turnstile dev-server`" in line and "TURNSTILE_REDIS_URL" in line
    assert "hunter2" not in line and "Transport" not in line and "celery" not in line.lower()


def test_the_start_wait_is_a_setting_and_a_separate_broker_is_waited_for_too(
    redis_url: str,
) -> None:
    """TURNSTILE_START_WAIT_S sets the wait as the flag does; with the store up, a Redis
    broker of its own that does not answer is the one line, naming the broker."""
    port = free_port()
    broker = f"redis://127.0.0.1:{port}/0"
    result, took_s = _no_store_worker(TURNSTILE_REDIS_URL=redis_url, TURNSTILE_BROKER_URL=broker,
                                      TURNSTILE_START_WAIT_S="1")  # fmt: skip
    assert result.returncode == 1 and took_s >= 1, result.stderr[-2000:]
    assert result.stderr.count("\n") == 1, result.stderr[-2000:]
    assert result.stderr.startswith(f"error: the broker at {broker} did not answer within 1 s")
    assert "TURNSTILE_BROKER_URL" in result.stderr


def test_a_worker_started_before_its_store_starts_when_the_store_does(unique: str) -> None:
    """The store comes up while the worker waits: the worker starts and runs a run."""
    port = free_port()
    queue = f"late-{unique}"
    worker = command_worker(f"redis://127.0.0.1:{port}/0", "-Q", queue, "--start-wait-s", "120")
    try:
        time.sleep(1.0)  # the worker is waiting by now (a slow import only waits less)
        assert popen(worker).poll() is None, worker.log()[-2000:]
        with EmbeddedServer(port=port) as server:
            worker.wait_ready()
            client = client_for(server.url)
            run_id = client.submit(f"t-{unique}", USER, "support", GOAL, queue=queue)
            wait_until(lambda: settled(client, [run_id]), what="the run ends")
            assert client.state(run_id).outcome is not None
            stop_all([worker])
    finally:
        worker.kill()


def test_a_celery_started_worker_with_no_store_exits_with_the_one_line() -> None:
    """A worker Celery starts itself (`celery -A ... worker`) waits TURNSTILE_START_WAIT_S
    for its store as it starts, then exits non-zero with the same line, not a hundred
    retries."""
    port = free_port()
    worker = WorkerProcess(f"redis://127.0.0.1:{port}/0", ["q"], name=f"nostore-{port}",
                           env={"TURNSTILE_START_WAIT_S": "1"})  # fmt: skip
    worker.start()
    assert popen(worker).wait(START_WAIT_MARGIN_S) != 0
    log = worker.log()
    assert f"error: the store at redis://127.0.0.1:{port}/0 did not answer within 1 s" in log, log
    assert "Trying again" not in log and "Traceback" not in log, log[-2000:]
