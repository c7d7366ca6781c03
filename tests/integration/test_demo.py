"""`turnstile demo` works on a machine with no Redis installed and no TURNSTILE_* variables."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.integration


def _orphans_since(started: float) -> list[str]:
    """Servers and workers started since `started` whose parent is gone: what a demo that did
    not clean up would leave behind (other tests' processes still have their parents)."""
    found = []
    for process in psutil.process_iter(["pid", "ppid", "cmdline", "create_time"]):
        cmdline = " ".join(process.info["cmdline"] or [])
        ours = "valkey-server" in cmdline or "celery" in cmdline
        if ours and process.info["ppid"] == 1 and process.info["create_time"] >= started:
            found.append(cmdline)
    return found


def test_demo_runs_on_a_bare_machine() -> None:
    """With only the project's own environment on PATH (no redis-server, no valkey-server)
    and no TURNSTILE_* variables, the demo starts its own server and two workers, runs the
    scenarios and the capped tenant's runs, prints its JSON and leaves nothing running."""
    started = time.time()
    bindir = Path(sys.executable).parent
    env = {k: v for k, v in os.environ.items() if not k.startswith("TURNSTILE_")}
    env["PATH"] = str(bindir)
    out = subprocess.run(
        [str(bindir / "turnstile"), "demo", "--runs", "4", "--json"],
        env=env, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    time.sleep(0.5)
    assert _orphans_since(started) == []  # everything it started, it stopped
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
    started = time.time()
    bindir = Path(sys.executable).parent
    env = {k: v for k, v in os.environ.items() if not k.startswith("TURNSTILE_")}
    demo = subprocess.Popen(
        [str(bindir / "turnstile"), "demo", "--runs", "200", "--json"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert demo.stderr is not None
    for line in demo.stderr:
        if "worker processes ready" in line:
            break
    demo.send_signal(signal.SIGTERM)
    assert demo.wait(60) == 128 + signal.SIGTERM
    demo.stderr.close()
    time.sleep(0.5)
    assert _orphans_since(started) == []
