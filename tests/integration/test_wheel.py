"""The wheel: one top-level package, installed into a fresh environment beside a service that
has its own `worker.py` and Celery app, and used from there against a real server."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.integration.workers import WorkerProcess, client_for, wait_until

# Builds the wheel and a fresh environment: run apart from the fast part (pyproject).
pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
SERVICE_WORKER = '''"""The service's own module named worker, with a Celery app of its own."""
from celery import Celery

SERVICE_MARK = "service"
app = Celery("service-tasks", set_as_current=False)
'''


def uv(*args: str, cwd: Path = ROOT) -> None:
    exe = shutil.which("uv")
    assert exe is not None, "the tests need uv (as the README says)"
    done = subprocess.run([exe, *args], cwd=cwd, capture_output=True, text=True, timeout=300,
                          check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`uv build --wheel`, then a fresh `uv venv` with the locked dependencies and the wheel,
    installed offline from uv's cache."""
    work = tmp_path_factory.mktemp("wheel")
    uv("build", "--wheel", "--out-dir", str(work / "dist"), str(ROOT))
    (wheel,) = (work / "dist").glob("turnstile-*.whl")
    tops = {name.split("/")[0] for name in zipfile.ZipFile(wheel).namelist()}
    assert tops == {"turnstile", wheel.name.split("-py3")[0] + ".dist-info"}, tops
    uv("export", "--frozen", "--no-dev", "--no-emit-project", "--format", "pylock.toml",
       "-o", str(work / "pylock.toml"))  # fmt: skip
    uv("venv", str(work / "venv"), "--python", sys.executable)
    python = str(work / "venv" / "bin" / "python")
    uv("pip", "install", "--offline", "--python", python, "-r", str(work / "pylock.toml"))
    uv("pip", "install", "--offline", "--no-deps", "--python", python, str(wheel))
    return work / "venv"


def test_the_wheel_leaves_a_services_worker_module_and_celery_app_alone(
    venv: Path, redis_url: str, unique: str, tmp_path: Path
) -> None:
    """From a fresh environment holding only the wheel, a service with its own `worker.py`
    and current Celery app imports the client and submits a run: its app and signals are
    unchanged and its `worker` still imports; the wheel's `turnstile worker` then runs it."""
    service = tmp_path / "service"
    service.mkdir()
    (service / "worker.py").write_text(SERVICE_WORKER)
    shutil.copy(ROOT / "tests" / "service_probe.py", service / "service_probe.py")
    queue = f"wheel-{unique}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TURNSTILE_", "PYTHON"))}
    env["TURNSTILE_SUBMIT_QUEUES"] = queue  # its worker starts after the submission
    done = subprocess.run(
        [str(venv / "bin" / "python"), "service_probe.py", redis_url, queue], cwd=service,
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    probe = json.loads(done.stdout.strip().splitlines()[-1])
    assert probe["turnstile_file"].startswith(str(venv))
    assert probe["service_worker_module"] == "service"
    assert probe["current_app_kept_on_import"] and probe["current_app_kept_after_submit"]
    assert probe["signals_untouched"] and probe["status"] == "running"

    worker = WorkerProcess(redis_url, [queue], name=f"wheel-{unique}")
    worker.env = {**{k: v for k, v in worker.env.items() if not k.startswith("PYTHON")}}
    worker.args = [str(venv / "bin" / "turnstile"), "worker", "--queues", queue,
                   "--concurrency", "1", "--name", f"wheel-{unique}@%h"]  # fmt: skip
    worker.start()
    try:
        worker.wait_ready()
        client = client_for(redis_url)
        wait_until(lambda: client.run_hash(probe["run_id"])[1]["status"] == "stopped",
                   what="the wheel's worker finishes the run")  # fmt: skip
        state = client.state(probe["run_id"])
        assert state.outcome is not None and state.outcome.value == "completed"
    finally:
        worker.stop()


def test_the_wheel_ships_the_code_that_was_tested_byte_for_byte(venv: Path) -> None:
    """Every file of the wheel's `turnstile` package is the checkout's file at the same path
    under turnstile/ (jobs/, ledger/, providers/ and worker/ reached through its links),
    unchanged: nothing is rewritten at build time; and every module of the checkout's code is
    in the wheel."""
    (wheel,) = (venv.parent / "dist").glob("turnstile-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        shipped = {n: archive.read(n) for n in archive.namelist() if n.startswith("turnstile/")}
    assert shipped
    changed = [n for n, data in shipped.items() if (ROOT / n).read_bytes() != data]
    assert changed == []
    modules = {
        str(p.relative_to(ROOT))
        for top in ("jobs", "ledger", "providers", "worker")
        for p in (ROOT / "turnstile" / top).rglob("*.py")
        if "__pycache__" not in p.parts
    }
    assert modules - set(shipped) == set()
