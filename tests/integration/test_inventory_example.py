"""The example inventory job (examples/inventory), whose tools all come from its own MCP server,
built and installed as a package of its own and run by `turnstile worker`: listed with its
MCP tools by `turnstile jobs`, its order held for a person, approved, placed once."""

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
from turnstile.jobs.outcomes import Outcome

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
TURNSTILE = str(Path(sys.executable).parent / "turnstile")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """examples/inventory built as a wheel and installed into a folder of its own."""
    uv = shutil.which("uv")
    assert uv is not None, "the tests need uv (as the README says)"
    work = tmp_path_factory.mktemp("inventory")
    subprocess.run([uv, "build", "--wheel", str(ROOT / "examples" / "inventory"), "--out-dir",
                    str(work / "dist")], check=True, capture_output=True, timeout=300)  # fmt: skip
    (wheel,) = (work / "dist").glob("turnstile_inventory-*.whl")
    subprocess.run([uv, "pip", "install", "--python", sys.executable, "--no-deps", "--target",
                    str(work / "site"), str(wheel)], check=True, capture_output=True,
                   timeout=300)  # fmt: skip
    return work / "site"


def turnstile(site: Path, redis_url: str, *args: str) -> Any:
    keep = {k: v for k, v in os.environ.items() if not k.startswith("TURNSTILE_")}
    env = {**keep, "PYTHONPATH": str(site), "TURNSTILE_REDIS_URL": redis_url}
    out = subprocess.run([TURNSTILE, *args, "--json"], env=env, capture_output=True, text=True,
                         timeout=120, check=False)  # fmt: skip
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.fixture
def worker(site: Path, redis_url: str, unique: str) -> Iterator[WorkerProcess]:
    queue = f"inventory-{unique}"
    process = WorkerProcess(redis_url, [queue], name=f"inventory-{unique}",
                            env={"PYTHONPATH": str(site)})  # fmt: skip
    process.args = [TURNSTILE, "worker", "--queues", queue, "--concurrency", "1",
                    "--name", f"inventory-{unique}@%h"]  # fmt: skip
    process.start()
    try:
        process.wait_ready()
        yield process
    finally:
        process.stop()


def test_the_inventory_package_lists_its_mcp_tools_and_its_order_waits_for_a_person(
    site: Path, redis_url: str, worker: WorkerProcess, unique: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """`turnstile jobs inventory` connects to the warehouse server and shows its two tools (a
    read and an irreversible write); a run for a SKU low on stock reads it, holds its order
    for approval, and once approved places it and completes; a SKU with enough stock orders
    nothing."""
    shown = turnstile(site, redis_url, "jobs", "inventory")
    (warehouse,) = shown["mcp"]
    assert warehouse["status"] == "ok" and warehouse["transport"] == "stdio"
    assert [(t["name"], t["mutates"], t["reversible"]) for t in warehouse["tools"]] == [
        ("stock_level", False, True),
        ("reorder", True, False),
    ]
    queue = worker.env["TURNSTILE_DEFAULT_QUEUE"]
    low = turnstile(site, redis_url, "submit", "--tenant", f"t-{unique}", "--user", "u1", "--job",
                    "inventory", "--goal", "keep SKU-7 in stock", "--param", "sku=SKU-7",
                    "--queue", queue)["run_id"]  # fmt: skip
    monkeypatch.syspath_prepend(str(site))  # this process's client sees the job too
    client = client_for(redis_url)
    wait_until(lambda: client.run_hash(low)[1]["status"] == "suspended", what="the held order")
    held = client.state(low).pending
    assert held is not None and held.call.name == "reorder"
    assert held.call.args == {"sku": "SKU-7", "quantity": 50}
    client.approve(low, by="alice", digest=held.digest)
    state = client.wait(low, timeout_s=60)
    assert state.outcome is Outcome.COMPLETED, state.reason
    assert state.answer == "Ordered 50 of SKU-7 (PO-1); had 3."
    enough = turnstile(site, redis_url, "submit", "--tenant", f"t-{unique}", "--user", "u1",
                       "--job", "inventory", "--goal", "keep SKU-1 in stock", "--param",
                       "sku=SKU-1", "--queue", queue)["run_id"]  # fmt: skip
    ended = client.wait(enough, timeout_s=60)
    assert ended.outcome is Outcome.COMPLETED and ended.answer == "SKU-1 has 120: no order needed."
