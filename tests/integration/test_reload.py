"""The edit loop: a job developed as a module named in TURNSTILE_JOBS (no wheel), run by
`turnstile worker --reload`, which restarts the worker when a file of the job's package
changes; and `submit --param`, which says in --help how it tells text from JSON."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import psutil
import pytest
from typer.testing import CliRunner

from tests.fixture_dist import pythonpath
from tests.integration.workers import WorkerProcess, client_for, wait_until
from turnstile.worker.cli.main import app

pytestmark = pytest.mark.integration

TURNSTILE = str(Path(sys.executable).parent / "turnstile")
JOB = '''
from typing import Any

from turnstile import Job, Scripted, ToolContext, tool
from reload_pkg.version import VERSION


@tool
def version(ctx: ToolContext) -> str:
    """Say which version of the code runs."""
    return VERSION


def reply(view: Any, turn: int) -> Any:
    if view["last_result"] is None:
        return {"type": "tool", "name": "version", "args": {}}
    return {"type": "final", "outcome": "completed", "text": view["last_result"]["result"]}


def job(client: Any = None) -> Job:
    return Job(name="reloadable", tools={"version": version},
               model=lambda params: Scripted(reply, 0.05))
'''


def _write_version(package: Path, version: str) -> None:
    path = package / "version.py"
    before = path.stat().st_mtime if path.exists() else time.time()
    path.write_text(f"VERSION = {version!r}\n")
    os.utime(path, (before + 2, before + 2))  # a later time, whatever the file system's grain


@pytest.mark.slow  # over 14 s on 2 cores: CI runs it in the slow part
def test_reload_restarts_the_worker_when_the_jobs_package_changes(
    redis_url: str, unique: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run answers with the code as it was; after a file of the job's package is saved the
    worker is restarted (said on one line), and the next run answers with the new code;
    SIGTERM stops the supervisor and its worker, exit 0."""
    package = tmp_path / "reload_pkg"
    package.mkdir()
    (package / "__init__.py").write_text(JOB)
    _write_version(package, "v1")
    spec = "reload_pkg:job"
    queue = f"reload-{unique}"
    worker = WorkerProcess(redis_url, [queue], name=f"reload-{unique}",
                           env={"PYTHONPATH": pythonpath([str(tmp_path)]),
                                "TURNSTILE_JOBS": spec})  # fmt: skip
    worker.args = [TURNSTILE, "worker", "--reload", "-Q", queue, "-c", "1"]
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("TURNSTILE_JOBS", spec)
    client = client_for(redis_url)

    def answer() -> str | None:
        run_id = client.submit(f"t-{unique}", "u1", "reloadable", "which version?", queue=queue)
        return client.wait(run_id, timeout_s=60).answer

    worker.start()
    try:
        worker.wait_ready()
        (watching,) = [ln for ln in worker.log().splitlines() if "--reload: watching" in ln]
        assert watching.endswith(f", {package}")  # the package's folder, after turnstile's
        assert answer() == "v1"
        children = [p.pid for p in worker.children()]
        _write_version(package, "v2")
        wait_until(lambda: worker.log().count('"worker_ready"') == 2, timeout_s=60,
                   what="the restarted worker")  # fmt: skip
        assert f"{package / 'version.py'} changed; restarting the worker" in worker.log()
        assert not any(psutil.pid_exists(pid) for pid in children[:1])  # the old worker went
        assert answer() == "v2"
        assert worker.process is not None
        worker.process.send_signal(signal.SIGTERM)
        assert worker.process.wait(30) == 0
        assert not any(p.is_running() for p in worker.children())
    finally:
        worker.kill()


def test_param_help_says_how_text_and_json_are_told_apart(redis_url: str, unique: str) -> None:
    """`submit --help` says a value is JSON when it parses and text otherwise; a param the job
    declares as a string stays text (`order=1001` is "1001"), an integer one is read as JSON."""
    result = CliRunner().invoke(app, ["submit", "--help"], env={"COLUMNS": "200"})
    said = " ".join(result.stdout.replace("│", " ").split())  # the help box's borders out
    assert "VALUE is read as JSON when it parses (1001 is a number" in said
    assert "a param the job's schema declares as a string is always text" in said
    submitted = CliRunner().invoke(
        app,
        ["submit", "--job", "support", "--tenant", f"t-{unique}", "--user", "u1", "--goal", "g",
         "--queue", f"idle-{unique}", "--param", "order=1001", "--param", "amount_cents=1000"],
        env={"TURNSTILE_REDIS_URL": redis_url},
    )  # fmt: skip
    assert submitted.exit_code == 0, submitted.output
    params = client_for(redis_url).state(submitted.stdout.strip()).params
    assert params == {"order": "1001", "amount_cents": 1000}
