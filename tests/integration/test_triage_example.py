"""The example triage job, built and installed as its own package, found through its entry
point and run by `turnstile worker`, `submit`, `approve`, `replay` and `demo --job triage`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.workers import WorkerProcess, client_for, wait_until

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
TURNSTILE = str(Path(sys.executable).parent / "turnstile")  # this environment's console script


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """examples/triage built as a wheel and installed (with its entry point) into a folder of
    its own, which the commands below get on PYTHONPATH."""
    uv = shutil.which("uv")
    assert uv is not None, "the tests need uv (as the README says)"
    work = tmp_path_factory.mktemp("triage")
    subprocess.run([uv, "build", "--wheel", str(ROOT / "examples" / "triage"), "--out-dir",
                    str(work / "dist")], check=True, capture_output=True, timeout=300)  # fmt: skip
    (wheel,) = (work / "dist").glob("turnstile_triage-*.whl")
    subprocess.run([uv, "pip", "install", "--python", sys.executable, "--no-deps", "--target",
                    str(work / "site"), str(wheel)], check=True, capture_output=True,
                   timeout=300)  # fmt: skip
    return work / "site"


def env_with(site: Path, redis_url: str) -> dict[str, str]:
    keep = {k: v for k, v in os.environ.items() if not k.startswith("TURNSTILE_")}
    return {**keep, "PYTHONPATH": str(site), "TURNSTILE_REDIS_URL": redis_url}


def turnstile(site: Path, redis_url: str, *args: str, timeout_s: float = 60) -> Any:
    out = subprocess.run(
        [TURNSTILE, *args, "--json"], env=env_with(site, redis_url), capture_output=True,
        text=True, timeout=timeout_s, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.fixture
def worker(site: Path, redis_url: str, unique: str) -> Iterator[WorkerProcess]:
    """`turnstile worker` (not `celery -A` by hand) with the example on its path."""
    queue = f"triage-{unique}"
    process = WorkerProcess(
        redis_url, [queue], name=f"triage-{unique}", env={"PYTHONPATH": str(site)}
    )
    process.args = [TURNSTILE, "worker", "--queues", queue, "--concurrency", "1",
                    "--name", f"triage-{unique}@%h"]  # fmt: skip
    process.start()
    try:
        process.wait_ready()
        yield process
    finally:
        process.stop()


def test_the_triage_package_runs_through_turnstile_worker_and_replays(
    site: Path, redis_url: str, worker: WorkerProcess, unique: str
) -> None:
    """Listed with its params, submitted from the CLI, held for approval of its reply,
    approved, completed with the billing article, and replayed to the same state."""
    listed = {r["name"]: r for r in turnstile(site, redis_url, "jobs")}
    triage = listed["triage"]
    assert triage["status"] == "ok"
    assert triage["source"] == "entry point triage = turnstile_triage:triage"
    assert triage["params_schema"]["required"] == ["ticket_id"]
    assert [t["name"] for t in triage["tools"]] == ["classify_ticket", "search_kb", "send_reply"]
    (ready,) = worker.events("worker_jobs")
    assert ready["jobs"] == ["support", "triage"]

    queue = worker.env["TURNSTILE_DEFAULT_QUEUE"]
    made = turnstile(site, redis_url, "submit", "--tenant", f"t-{unique}", "--user", "u1",
                     "--job", "triage", "--goal", "I was charged twice for my subscription",
                     "--param", "ticket_id=T-1", "--queue", queue)  # fmt: skip
    run_id = made["run_id"]
    client = client_for(redis_url)
    wait_until(lambda: client.run_hash(run_id)[1]["status"] == "suspended", what="the held reply")
    held = client.state(run_id).pending
    assert held is not None and held.call.name == "send_reply"
    turnstile(site, redis_url, "approve", run_id, "--by", "tester")
    wait_until(lambda: client.run_hash(run_id)[1]["status"] == "stopped", what="the run ends")
    state = client.state(run_id)
    assert state.outcome is not None and state.outcome.value == "completed"
    assert state.facts["category"] == "billing" and state.facts["article_id"] == "KB-101"
    replayed = turnstile(site, redis_url, "replay", run_id)
    assert replayed["matches"] is True and replayed["replayed_outcome"] == "completed"


@pytest.mark.slow  # over 14 s on 2 cores: CI runs it in the slow part
def test_demo_shows_the_triage_examples(site: Path, redis_url: str) -> None:
    """`turnstile demo --job triage` runs the job's declared examples through two workers,
    approves the held replies, and every run completes."""
    result = turnstile(site, redis_url, "demo", "--job", "triage", timeout_s=240)
    assert [r["outcome"] for r in result["runs"]] == ["completed", "completed"]
    assert {r["answer"] for r in result["runs"]} == {"Replied (billing).", "Replied (bug)."}
