"""MCP tools when things go wrong around them, in real worker processes: a worker SIGKILLed in
the middle of an MCP write, an HTTP server that goes down after the worker listed its tools,
and the same MCP jobs on a green (gevent) worker."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tests.integration.workers import WorkerProcess, client_for, running_workers, wait_until
from tests.mcp_servers import records, serving
from turnstile.jobs.outcomes import Outcome
from turnstile.worker.cli.main import app
from turnstile.worker.client._client import Client

pytestmark = pytest.mark.integration

KEY, RUN = "turnstile/idempotency-key", "turnstile/run-id"
JOBS = "desk", "desk_http", "slow_http", "slow_write", "down"
SPEC = ",".join(f"tests.mcp_jobs:{name}" for name in JOBS)
# A stdio server's first start imports the `mcp` package: seconds on a loaded machine.
ROOT = Path(__file__).parents[2]
FAST_MCP = {"TURNSTILE_MCP_CONNECT_TIMEOUT_S": "30", "TURNSTILE_MCP_RETRY_S": "1"}


@pytest.fixture
def record(tmp_path: Path) -> Path:
    return tmp_path / "record.jsonl"


@pytest.fixture
def desk_url(record: Path) -> Iterator[str]:
    with serving(record) as (url, _):
        yield url


@pytest.fixture
def client(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> Client:
    monkeypatch.setenv("TURNSTILE_JOBS", SPEC)
    return client_for(redis_url)


def env(record: Path, **urls: str) -> dict[str, str]:
    return {"TURNSTILE_JOBS": SPEC, "MCP_TEST_RECORD": str(record), **urls, **FAST_MCP}


def events(record: Path, event: str, **match: Any) -> list[dict[str, Any]]:
    return [r for r in records(record) if r["event"] == event
            and all(r.get(k) == v for k, v in match.items())]  # fmt: skip


@pytest.mark.slow  # over 10 s on 2 cores: CI runs it in the slow part
def test_a_worker_killed_during_an_mcp_write_sends_the_same_key_again_and_it_runs_once(
    *, redis_url: str, client: Client, record: Path, desk_url: str, unique: str
) -> None:
    """The worker is SIGKILLed while an MCP write is in flight (the server did it and is slow
    to answer): the sweeper sends the step again, another worker runs the turn again, and the
    server receives the same call under the same idempotency key, which it answers from its
    record; the write was done once and the run completes."""
    queue, tenant = f"mcp-kill-{unique}", f"t-{unique}"
    with running_workers(redis_url, [queue], 1, env=env(record, MCP_TEST_URL=desk_url),
                         prefix="first") as (first,):  # fmt: skip
        run_id = client.submit(tenant, "u1", "mcp_slow_write", "reorder", {"seconds": 8},
                               queue=queue)  # fmt: skip
        wait_until(lambda: bool(events(record, "executed", tool="slow_write")), timeout_s=60,
                   what="the write done, its answer on its way")  # fmt: skip
        first.kill()
    assert client.state(run_id).status.value == "running"
    with running_workers(redis_url, [queue], 1, env=env(record, MCP_TEST_URL=desk_url),
                         prefix="second"):  # fmt: skip
        state = client.wait(run_id, timeout_s=90)
    assert state.outcome is Outcome.COMPLETED, state.reason
    made = [r for r in events(record, "call", tool="slow_write") if r["meta"][RUN] == run_id]
    assert len(made) == 2
    assert made[0]["meta"][KEY] == made[1]["meta"][KEY] == f"{run_id}:1.0"
    assert len(events(record, "executed", tool="slow_write")) == 1
    assert state.last_result == {"status": "ok", "result": {"title": "reorder", "replayed": True}}


def test_an_http_server_down_after_listing_is_a_tool_failure_the_model_sees(
    *, redis_url: str, client: Client, record: Path, unique: str
) -> None:
    """The worker listed the server's tools; the server goes down: each call fails at once, a
    failure the model is shown naming the server and why, and the run ends `tool_failure`;
    the worker is alive and runs the next run."""
    queue, tenant = f"mcp-down-{unique}", f"t-{unique}"
    with serving(record) as (down_url, server):
        urls = {"MCP_TEST_DOWN_URL": down_url, "MCP_TEST_URL": down_url}
        with running_workers(redis_url, [queue], 1, env=env(record, **urls)) as (worker,):
            wait_until(lambda: any(e["transport"] == "http" and e["tools"] > 0
                                   for e in worker.events("mcp_server_connected")),
                       timeout_s=60, what="the worker listing the server's tools")  # fmt: skip
            server.kill()
            server.wait(10)
            run_id = client.submit(tenant, "u1", "mcp_down", "look it up", queue=queue)
            state = client.wait(run_id, timeout_s=60)
            assert state.outcome is Outcome.TOOL_FAILURE, state.reason
            assert state.last_result is not None
            assert state.last_result["code"] == "tool_raised"
            detail = state.last_result["detail"]
            assert detail.startswith("McpUnavailableError: server 'desk': "), detail
            assert worker.process is not None and worker.process.poll() is None
            after = client.submit(tenant, "u1", "mcp_desk", "look it up", queue=queue)
            assert client.wait(after, timeout_s=90).outcome is Outcome.COMPLETED


def test_mcp_tools_on_a_green_worker(
    *, redis_url: str, client: Client, record: Path, desk_url: str, unique: str
) -> None:
    """On the gevent pool, runs of MCP tools over stdio and HTTP complete side by side, their
    calls waited for without holding the hub, and a slow call is cut at its run's deadline
    with the server told to cancel."""
    queue, tenant = f"mcp-green-{unique}", f"t-{unique}"
    # `turnstile worker` (the green pool's command) finds the test jobs on the PYTHONPATH.
    green = {**env(record, MCP_TEST_URL=desk_url), "PYTHONPATH": str(ROOT)}
    with running_workers(redis_url, [queue], 1, env=green, pool="gevent"):
        runs = [client.submit(tenant, "u1", job, "look it up", queue=queue)
                for job in ("mcp_desk", "mcp_desk_http") * 4]  # fmt: skip
        slow = client.submit(tenant, "u1", "mcp_slow_http", "wait", queue=queue)
        states = [client.wait(r, timeout_s=120) for r in runs]
        assert {s.outcome for s in states} == {Outcome.COMPLETED}, [
            (s.status, s.reason, s.last_result) for s in states
        ]
        assert {s.answer for s in states} == {"order is shipped with DHL"}
        ended = client.wait(slow, timeout_s=60)
    assert (ended.outcome, ended.detail) == (Outcome.BUDGET_EXHAUSTED, "deadline")
    started = time.monotonic()
    while not events(record, "cancelled") and time.monotonic() - started < 10:
        time.sleep(0.1)
    assert events(record, "cancelled", tool="slow_read")


def test_a_secrets_file_that_cannot_be_read_stops_a_worker_and_a_command_in_one_line(
    *, redis_url: str, tmp_path: Path, unique: str
) -> None:
    """A secrets file of the wrong shape: the worker does not start (non-zero, one line naming
    the file and what it should be), and `turnstile jobs NAME` says the same line."""
    bad = tmp_path / "secrets.json"
    bad.write_text(json.dumps({"crm": ["not", "a", "map"]}))
    said = (f"error: TURNSTILE_MCP_SECRETS_FILE {bad}: server 'crm': expected "
            '{"<server>": {"*" or "<tenant>": {"<header or variable>": "<value>"}}}')  # fmt: skip
    worker = WorkerProcess(redis_url, [f"q-{unique}"], name=f"secrets-{unique}",
                           env={"TURNSTILE_MCP_SECRETS_FILE": str(bad)}).start()  # fmt: skip
    assert worker.process is not None
    assert worker.process.wait(60) != 0
    lines = [line for line in worker.log().splitlines() if "TURNSTILE_MCP_SECRETS_FILE" in line]
    assert lines == [said], worker.log()[-2000:]
    shown = CliRunner().invoke(app, ["jobs", "mcp_desk"], env={
        "TURNSTILE_JOBS": SPEC, "TURNSTILE_MCP_SECRETS_FILE": str(bad)})  # fmt: skip
    assert shown.exit_code == 1 and shown.stderr == said + "\n"
