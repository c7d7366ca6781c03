"""Real Celery worker processes for the integration tests, and a client to drive them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil

from turnstile.jobs.support.scenarios import effects_of, row, table
from turnstile.worker.client._client import Client, connect_client
from turnstile.worker.dev.shop import RedisShop
from turnstile.worker.settings import Settings

READY_TIMEOUT_S = 60.0  # a loaded 2-core machine takes 30 s to import a worker

# Fast timers for tests: a lapsed lease is found within a second.
FAST = {
    "TURNSTILE_SWEEP_INTERVAL_S": "0.5",
    "TURNSTILE_PICKUP_LEASE_S": "3",
    "TURNSTILE_INFLIGHT_LEASE_S": "6",
    "TURNSTILE_RETRY_BASE_S": "0.2",
    "TURNSTILE_RETRY_MAX_S": "1",
    "TURNSTILE_LEDGER_GRACE_S": "5",
    "TURNSTILE_ALLOW_DRILLS": "1",  # the failure-matrix tests kill and hang workers on purpose
}


TURNSTILE = str(Path(sys.executable).parent / "turnstile")
# Turns in flight of a green test worker for each prefork process a test asks for.
GREEN_PER_PROCESS = 50


class WorkerProcess:
    """One worker process on given queues: `celery worker` on prefork (concurrency 1 by
    default), or `turnstile worker --pool gevent`, which patches first, holding
    GREEN_PER_PROCESS turns in flight for each process asked for, under a supervisor that
    restarts it when it is killed (see supervise.py)."""

    def __init__(
        self,
        redis_url: str,
        queues: list[str],
        *,
        name: str,
        env: Mapping[str, str] | None = None,
        broker_url: str | None = None,
        concurrency: int = 1,
        pool: str = "prefork",
        tree: Path | None = None,
    ) -> None:
        """`tree`: run the worker from that checkout's own .venv (a benchmark's side by side
        comparison); None: this one's."""
        self.name, self.pool = name, pool
        python = str(tree / ".venv" / "bin" / "python") if tree is not None else sys.executable
        turnstile = str(Path(python).parent / "turnstile")
        self.log_path = Path(tempfile.mkdtemp(prefix="turnstile-worker-")) / f"{name}.log"
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("TURNSTILE_")},
            **FAST,
            "TURNSTILE_REDIS_URL": redis_url,
            "TURNSTILE_BROKER_URL": broker_url or redis_url,
            "TURNSTILE_LOG_FORMAT": "json",
            "TURNSTILE_DEFAULT_QUEUE": queues[0],
            **(env or {}),
        }
        self.args = [
            python, "-m", "celery", "-A", "turnstile.worker.runtime.app:app", "worker",
            "-Q", ",".join(queues), "-c", str(concurrency), "-P", "prefork",
            "-n", f"{name}@%h", "--without-gossip", "--without-mingle",
            "--without-heartbeat", "-l", "WARNING",
        ]  # fmt: skip
        if pool != "prefork":
            self.args = [
                sys.executable, "-m", "tests.integration.supervise",
                turnstile, "worker", "--redis-url", redis_url, "-Q", ",".join(queues),
                "-c", str(concurrency * GREEN_PER_PROCESS), "--pool", pool,
                "-n", f"{name}@%h", "--loglevel", "WARNING",
            ]  # fmt: skip
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> WorkerProcess:
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                self.args,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self

    def wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if '"worker_ready"' in self.log():
                return
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(f"worker {self.name} exited: {self.log()[-2000:]}")
            time.sleep(0.05)
        raise RuntimeError(f"worker {self.name} not ready: {self.log()[-2000:]}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def events(self, name: str) -> list[dict[str, Any]]:
        """The structured log lines with this event name."""
        out = []
        for line in self.log().splitlines():
            if f'"{name}"' in line:
                try:
                    out.append(json.loads(line[line.index("{") :]))
                except ValueError:
                    continue
        return out

    def children(self) -> list[psutil.Process]:
        assert self.process is not None
        try:
            return psutil.Process(self.process.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def kill(self) -> None:
        """SIGKILL to the worker and its pool: nothing gets to clean up."""
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(10)

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM: a warm shutdown, the current turn finishes first."""
        stop_all([self], timeout_s)

    def terminate(self) -> None:
        """SIGTERM without waiting: a warm shutdown begins (see stop_all)."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)

    def wait_stopped(self, timeout_s: float) -> None:
        """Wait for the shutdown `terminate` began; SIGKILL once `timeout_s` has passed."""
        if self.process is None:
            return
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()


def stop_all(workers: list[WorkerProcess], timeout_s: float = 30.0) -> None:
    """A warm shutdown of every worker at once, each killed if it is not done `timeout_s`
    after its SIGTERM. Their shutdowns overlap: an idle worker takes about 2 s to stop on
    prefork and 5 s on gevent (Celery's own pauses), and one after another that added up to
    over a minute of the suite."""
    for worker in workers:
        worker.terminate()
    deadline = time.monotonic() + timeout_s
    for worker in workers:
        worker.wait_stopped(max(0.0, deadline - time.monotonic()))


@contextmanager
def running_workers(
    redis_url: str,
    queues: list[str],
    count: int = 2,
    *,
    env: Mapping[str, str] | None = None,
    broker_url: str | None = None,
    prefix: str = "w",
    concurrency: int = 1,
    stop_timeout_s: float = 10.0,
    pool: str = "prefork",
) -> Iterator[list[WorkerProcess]]:
    """`count` worker processes of `concurrency` pool processes each, ready when yielded."""
    workers = [
        WorkerProcess(redis_url, queues, name=f"{prefix}{i}-{os.getpid()}-{time.monotonic_ns()}",
                      env=env, broker_url=broker_url, concurrency=concurrency,
                      pool=pool).start()
        for i in range(count)
    ]  # fmt: skip
    try:
        for worker in workers:
            worker.wait_ready()
        yield workers
    finally:
        stop_all(workers, stop_timeout_s)


# Every client `client_for` made, in order: tests/integration/conftest.py closes the ones a test
# made when it ends. A client left to the garbage collector in a reference cycle (a test's
# frame kept by a caught exception's traceback, say) is finalised in some later test with its
# sockets still open, and the ResourceWarning (an error here) fails that test instead.
MADE: list[Client] = []


def client_for(redis_url: str, broker_url: str | None = None, **overrides: Any) -> Client:
    overrides.setdefault("allow_drills", True)  # as the test workers (FAST) are started
    config = Settings(redis_url=redis_url, broker_url=broker_url, **overrides)
    made = connect_client(config)
    MADE.append(made)
    return made


def wait_until(
    predicate: Callable[[], bool],
    *,
    timeout_s: float = 60.0,
    every_s: float = 0.05,
    what: str | Callable[[], str] = "",
) -> None:
    """Wait for `predicate`; `what` names it in the failure (a callable: read at the failure,
    to say what was seen then)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(every_s)
    said = what() if callable(what) else what
    raise AssertionError(f"timed out after {timeout_s} s waiting for {said or predicate}")


def expected_rows() -> dict[str, dict[str, Any]]:
    """The reference scenario table as the kernel gives it in process, by letter."""
    return {r["scenario"]: {k: v for k, v in r.items() if k != "scenario"} for r in table()}


def stored_row(client: Client, run_id: str) -> dict[str, Any]:
    """The same row for a run that went through the queue: its stored state, its shop's effects."""
    state = client.state(run_id)
    got = row("", state, effects_of(RedisShop(client.client), state))
    del got["scenario"]
    return got


def shop_effects(client: Client, run_id: str) -> list[list[Any]]:
    """What the run's shop recorded in the world: its tenant's shop of the name the run gives."""
    return effects_of(RedisShop(client.client), client.state(run_id))


def settled(client: Client, run_ids: list[str]) -> bool:
    """Every run has stopped or is waiting for a person."""
    return all(client.run_hash(r)[1]["status"] in ("stopped", "suspended") for r in run_ids)


def ended_once(client: Client, tenant: str, run_id: str) -> None:
    """The run ended exactly once, and every version was committed by one turn only."""
    stream = [e for _, e in client.store.events(tenant, run_id)]
    assert [e["type"] for e in stream].count("finished") == 1, run_id
    versions = [e["version"] for e in stream if e["type"] == "turn"]
    assert len(versions) == len(set(versions)), run_id


def ledger_is_the_runs_usage(client: Client, tenant: str, run_ids: list[str]) -> None:
    """Nothing is held for the tenant any more, and what it was charged is exactly what its
    runs recorded as used."""
    figures = client.ledger.read(tenant)
    states = [client.state(r) for r in run_ids]
    used = {
        "cost_microusd": sum(s.usage.cost_microusd for s in states),
        "tokens": sum(s.usage.tokens for s in states),
        "steps": sum(s.usage.steps for s in states),
        "tool_calls": sum(s.usage.tool_calls for s in states),
    }
    for dimension, amount in used.items():
        got = figures.get(dimension)
        figure = (got.committed, got.reserved) if got is not None else (0, 0)
        assert figure == (amount, 0), (dimension, got, amount)
