"""`turnstile demo` works on a machine with no Redis installed and no TURNSTILE_* variables."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.integration


MARK = "DEMO_TEST_MARK"  # not TURNSTILE_*: the demo passes those on to nothing
"""Set in the demo's environment with a value of the test's own; the server and the workers
the demo starts inherit it, so they can be told apart from other tests' and other people's
processes on the same machine."""


def _marked(mark: str) -> list[str]:
    """Live processes (zombies aside) with this test's mark in their environment."""
    found = []
    for process in psutil.process_iter(["pid", "cmdline", "status"]):
        try:
            if process.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if process.environ().get(MARK) == mark:
                found.append(f"{process.info['pid']}: {' '.join(process.info['cmdline'] or [])}")
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def _left_running(mark: str, timeout_s: float = 10.0) -> list[str]:
    """What the demo started and did not stop: its marked processes that are still alive a
    moment after it exited (a process it killed may take a moment to be reaped)."""
    deadline = time.monotonic() + timeout_s
    while (found := _marked(mark)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return found


def _demo_env(mark: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TURNSTILE_")}
    env[MARK] = mark
    return env


def test_demo_runs_on_a_bare_machine() -> None:
    """With only the project's own environment on PATH (no redis-server, no valkey-server)
    and no TURNSTILE_* variables, the demo starts its own server and two workers, runs the
    scenarios and the capped tenant's runs, prints its JSON and leaves nothing running."""
    mark = uuid.uuid4().hex
    bindir = Path(sys.executable).parent
    env = _demo_env(mark)
    env["PATH"] = str(bindir)
    out = subprocess.run(
        [str(bindir / "turnstile"), "demo", "--runs", "4", "--json"],
        env=env, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert _left_running(mark) == []  # everything it started, it stopped
    result = json.loads(out.stdout)
    runs = result["runs"]
    assert len(runs) == 12
    by_outcome = {r["outcome"] for r in runs}
    assert {"completed", "loop_detected", "budget_exhausted", "unknown_outcome"} <= by_outcome
    capped = [r for r in runs if r["tenant"].startswith("capped-")]
    assert any(r["detail"] == "tenant.cost_microusd" for r in capped)
    for tenant, dims in result["ledger"].items():
        assert dims["cost_microusd"]["reserved"] == 0
        ceiling = dims["cost_microusd"]["ceiling"]
        assert ceiling is None or dims["cost_microusd"]["committed"] <= ceiling, tenant
    assert set(runs[0]) == {"run_id", "tenant", "outcome", "detail", "steps", "tool_calls",
                            "tokens", "cost_microusd", "effects", "answer"}  # fmt: skip


def test_a_terminated_demo_stops_what_it_started() -> None:
    """SIGTERM in the middle of the demo stops its workers and its server before it exits."""
    mark = uuid.uuid4().hex
    bindir = Path(sys.executable).parent
    env = _demo_env(mark)
    demo = subprocess.Popen(
        # The most runs (500), so the demo is still running when the signal comes: 200 zero-latency
        # runs once ended between the workers' readiness and the signal, and the demo exited 0.
        [str(bindir / "turnstile"), "demo", "--runs", "500", "--json"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert demo.stderr is not None
    for line in demo.stderr:
        if "worker processes ready" in line:
            break
    started = _marked(mark)
    assert len(started) >= 3, started  # the server and two workers, seen by their mark
    assert demo.poll() is None, "the demo ended before it was signalled: nothing tested"
    demo.send_signal(signal.SIGTERM)
    assert demo.wait(60) == 128 + signal.SIGTERM
    demo.stderr.close()
    assert _left_running(mark) == []
