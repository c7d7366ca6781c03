"""Importing Turnstile's client and job API changes nothing in the importing process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def test_importing_the_client_keeps_the_services_celery_app_and_signals(
    redis_url: str, unique: str
) -> None:
    """A process with its own current Celery app imports `turnstile`, connects and submits a
    run: its current app and the worker signals' receivers are unchanged, and no step task
    is registered anywhere but the private producer."""
    out = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "service_probe.py"), redis_url, f"probe-{unique}"],
        capture_output=True, text=True, timeout=120, cwd=ROOT, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    probe = json.loads(out.stdout.strip().splitlines()[-1])
    assert probe["current_app_kept_on_import"] is True
    assert probe["current_app_kept_after_submit"] is True
    assert probe["signals_untouched"] is True
    assert probe["status"] == "running" and probe["run_id"].startswith("run_")
    assert probe["service_worker_module"] is None  # the editable install adds no `worker`
