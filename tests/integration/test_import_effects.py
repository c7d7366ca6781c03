"""Importing Turnstile's client and job API changes nothing in the importing process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from turnstile.worker.broker.layout import broker_depth

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


CLIENT_LOADS = """
import json, sys
import turnstile.worker.client
from turnstile import Budget, Settings, connect_client

WATCHED = ("celery.worker", "kombu.transport", "turnstile.worker.runtime")

def loaded():
    return sorted(m for m in WATCHED if m in sys.modules)

after_import = loaded()
client = connect_client(Settings(redis_url=sys.argv[1], fair_share=False))
after_connect = loaded()
client.submit("probe", "cu_ana", "support", "refund the damaged item", {},
              budget=Budget(), queue=sys.argv[2])
print(json.dumps({"import": after_import, "connect": after_connect, "publish": loaded()}))
"""


def test_the_client_loads_celerys_worker_side_neither_on_import_nor_when_it_publishes(
    redis_url: str, unique: str
) -> None:
    """In a fresh interpreter, importing the client (`turnstile.worker.client`, `from turnstile
    import connect_client`) and connecting it loads neither `celery.worker`, `kombu.transport`
    nor `turnstile.worker.runtime`; publishing a step (fair share off: the submission sends it
    to the broker itself) loads kombu's transport and still neither Celery's worker side nor
    anything of the worker's runtime (the producer's app is configured in worker/broker/)."""
    queue = f"nobody-{unique}"
    out = subprocess.run(
        [sys.executable, "-c", CLIENT_LOADS, redis_url, queue],
        capture_output=True, text=True, timeout=120, cwd=ROOT, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert loaded["import"] == [] and loaded["connect"] == []
    assert loaded["publish"] == ["kombu.transport"]  # the producer, at last, and only it
    assert broker_depth(redis_url, queue) == 1  # the step was published


CLIENT_RUNTIME = """
import json, sys
from turnstile import Budget, Settings, connect_client

client = connect_client(Settings(redis_url=sys.argv[1]))
client.submit("probe", "cu_ana", "support", "refund the damaged item", {},
              budget=Budget(), queue=sys.argv[2])
print(json.dumps(sorted(m for m in sys.modules if m.startswith("turnstile.worker.runtime"))))
"""


def test_a_submission_loads_nothing_of_the_worker_runtime(redis_url: str, unique: str) -> None:
    """In a fresh interpreter, connecting the client and submitting a run with fair share on
    (its first step's time limits and ledger hold computed, the step put in its tenant's
    pending list) imports no module of `turnstile.worker.runtime`, the worker process's side;
    only a publish to the broker builds the producer's Celery app."""
    out = subprocess.run(
        [sys.executable, "-c", CLIENT_RUNTIME, redis_url, f"nobody-{unique}"],
        capture_output=True, text=True, timeout=120, cwd=ROOT, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
