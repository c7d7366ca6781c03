"""The worker and the client are wired from a Settings value: no server is touched to build them."""

from __future__ import annotations

import os

import pytest
from typer.testing import CliRunner

from turnstile.worker.cli.main import app as cli
from turnstile.worker.client._client import connect_client
from turnstile.worker.runtime.app import make_app
from turnstile.worker.runtime.services import WorkerServices
from turnstile.worker.settings import Settings

NOWHERE = "redis://127.0.0.1:1/0"  # never connected to: building opens no connection


def test_a_worker_process_builds_one_job_registry_for_its_steps_store_and_log() -> None:
    """A worker process's step services, its run store and its jobs log share the one
    registry the process built, and the services carry the Settings the worker was given."""
    config = Settings(redis_url=NOWHERE, allow_drills=True)
    worker = WorkerServices(config, make_app(config, main=False))
    services = worker.services()
    assert services.jobs is worker.jobs() is services.store.jobs
    assert services is worker.services() and services.settings is config
    assert services.jobs.drills is True


def test_a_client_builds_one_job_registry_for_itself_and_its_store() -> None:
    """A client's run store takes the client's registry instead of building its own."""
    client = connect_client(Settings(redis_url=NOWHERE))
    assert client.store.jobs is client.jobs


def test_the_worker_command_configures_through_settings_not_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`turnstile worker` passes its flags in a Settings value: a run that stops at a bad
    setting leaves no TURNSTILE_* variable behind that it did not find."""
    for name in ("TURNSTILE_POOL", "TURNSTILE_CONCURRENCY", "TURNSTILE_BROKER_URL"):
        monkeypatch.delenv(name, raising=False)
    before = {k: v for k, v in os.environ.items() if k.startswith("TURNSTILE_")}
    result = CliRunner().invoke(
        cli,
        ["worker", "--redis-url", NOWHERE, "--broker-url", NOWHERE, "-c", "3"],
        env={"TURNSTILE_MAX_STEP_ATTEMPTS": "0"},
    )
    assert result.exit_code == 2 and "bad TURNSTILE_MAX_STEP_ATTEMPTS" in result.stderr
    assert {k: v for k, v in os.environ.items() if k.startswith("TURNSTILE_")} == before
