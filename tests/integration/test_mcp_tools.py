"""A job's tools from real MCP servers (tests/mcp_servers.py, the `mcp` package's own server),
over stdio and streamable HTTP, in real worker processes: runs complete on a scripted model
and on the fake OpenAI server, and the run's rules hold for every MCP call: its deadline
(with the server told to cancel), approvals, idempotency keys in `_meta`, a server that is
down or dies, and servers that list or answer what cannot be used."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tests.integration.workers import WorkerProcess, client_for, running_workers, wait_until
from tests.mcp_jobs import SPEC
from tests.mcp_servers import records, serving
from tests.wire.wire import Wire, wire_server
from turnstile.jobs.outcomes import Outcome
from turnstile.jobs.state import RunState
from turnstile.worker.cli.main import app
from turnstile.worker.client._client import Client

pytestmark = pytest.mark.integration

KEY, RUN = "turnstile/idempotency-key", "turnstile/run-id"
ACME_TOKEN = "acme-token"  # noqa: S105 - the test secrets file's own
# A stdio server's first start imports the `mcp` package: seconds on a loaded machine.
FAST_MCP = {"TURNSTILE_MCP_CONNECT_TIMEOUT_S": "30", "TURNSTILE_MCP_RETRY_S": "1"}


@pytest.fixture(scope="module")
def record(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where every test server of the module records what it received."""
    return tmp_path_factory.mktemp("mcp") / "record.jsonl"


@pytest.fixture(scope="module")
def desk_url(record: Path) -> Iterator[str]:
    with serving(record) as (url, _):
        yield url


@pytest.fixture(scope="module")
def wire() -> Iterator[Wire]:
    with wire_server("openai", script={"agent": {"args": {"lookup_order": {"order": "A-1"}}}}) as w:
        yield w


@pytest.fixture(scope="module")
def secrets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("mcp-secrets") / "secrets.json"
    path.write_text(json.dumps({"tenanted": {"acme": {"X-Tenant-Token": ACME_TOKEN}}}))
    return path


@pytest.fixture(scope="module")
def env(record: Path, desk_url: str, wire: Wire, secrets: Path) -> dict[str, str]:
    return {"TURNSTILE_JOBS": SPEC, "MCP_TEST_RECORD": str(record), "MCP_TEST_URL": desk_url,
            "TURNSTILE_MCP_SECRETS_FILE": str(secrets), **FAST_MCP, **wire.env}  # fmt: skip


@pytest.fixture(scope="module")
def queue() -> str:
    return "mcp-tools"


@pytest.fixture(scope="module")
def worker(redis_url: str, env: dict[str, str], queue: str) -> Iterator[WorkerProcess]:
    with running_workers(redis_url, [queue], 1, env=env, concurrency=2) as (started,):
        yield started


@pytest.fixture
def client(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> Client:
    """A client that knows the MCP jobs (it checks a submission's job and params)."""
    monkeypatch.setenv("TURNSTILE_JOBS", SPEC)
    return client_for(redis_url)


def run(client: Client, queue: str, tenant: str, job: str, **params: Any) -> RunState:
    run_id = client.submit(tenant, "u1", job, "handle order A-1", params, queue=queue)
    return client.wait(run_id, timeout_s=90)


def turn_results(client: Client, run_id: str) -> list[Any]:
    """Each turn's observation, in order."""
    tenant = client.tenant_of(run_id)
    return [e["last_result"] for _, e in client.store.events(tenant, run_id) if e["type"] == "turn"]


def calls(record: Path, run_id: str, tool: str | None = None) -> list[dict[str, Any]]:
    """The calls of one run the servers recorded (`tool`: of that tool only)."""
    return [r for r in records(record) if r["event"] == "call"
            and r["meta"].get(RUN) == run_id and (tool is None or r["tool"] == tool)]  # fmt: skip


@pytest.mark.parametrize("job", ["mcp_desk", "mcp_desk_http"])
def test_a_job_of_mcp_tools_completes_on_a_scripted_model(
    *, worker: WorkerProcess, client: Client, queue: str, record: Path, unique: str, job: str
) -> None:
    """Over stdio and over HTTP, a job whose tools all come from an MCP server completes: a
    read and a reversible write ran, each carrying the run's idempotency key in `_meta`, and
    the read's structured result became facts the model answered from."""
    state = run(client, queue, f"t-{unique}", job)
    assert state.outcome is Outcome.COMPLETED, state.reason
    assert state.answer == "order is shipped with DHL", turn_results(client, state.run_id)
    assert state.facts == {"state": "shipped", "carrier": "DHL"}
    made = calls(record, state.run_id)
    assert [c["tool"] for c in made] == ["lookup_order", "add_note"]
    assert made[1]["args"] == {"order": "A-1", "note": "called"}
    assert all(c["meta"][KEY].startswith(f"{state.run_id}:") for c in made)


@pytest.mark.parametrize("job", ["mcp_desk_openai", "mcp_desk_openai_http"])
def test_a_job_of_mcp_tools_completes_on_the_fake_openai_server(
    *, worker: WorkerProcess, client: Client, queue: str, record: Path, wire: Wire, unique: str,
    job: str,
) -> None:  # fmt: skip
    """On the OpenAI wire format, the model is offered the MCP tools (the allow-listed two,
    with their schemas), plans them, calls each, and the run completes."""
    before = len(wire.received())
    state = run(client, queue, f"t-{unique}", job, model="openai:gpt-4.1-mini")
    assert state.outcome is Outcome.COMPLETED, state.reason
    assert [c["tool"] for c in calls(record, state.run_id)] == ["lookup_order", "add_note"]
    asked = wire.received()[before]["body"]
    offered = {t["function"]["name"]: t["function"] for t in asked["tools"]}
    assert {"lookup_order", "add_note"} <= set(offered)
    assert "create_ticket" not in offered  # not allow-listed
    assert offered["lookup_order"]["parameters"]["properties"]["order"]["type"] == "string"
    assert state.facts == {"state": "shipped", "carrier": "DHL"}


@pytest.mark.parametrize("job", ["mcp_slow", "mcp_slow_http"])
def test_a_slow_mcp_call_ends_the_run_at_its_deadline_and_the_server_is_told_to_cancel(
    *, worker: WorkerProcess, client: Client, queue: str, record: Path, unique: str, job: str
) -> None:
    """A read that would take a minute in a run of three seconds: the call is cut at the run's
    remaining time (a timeout the model is shown, no traceback logged), the run ends
    `budget_exhausted` (deadline), and the server received the cancellation (its handler was
    cancelled)."""
    state = run(client, queue, f"t-{unique}", job)
    assert (state.outcome, state.detail) == (Outcome.BUDGET_EXHAUSTED, "deadline"), state.reason
    assert state.usage.elapsed_ms <= 3000
    assert turn_results(client, state.run_id)[0] == {"status": "error", "code": "timeout"}
    assert [e for e in worker.events("tool_raised") if e.get("run_id") == state.run_id] == []
    (made,) = calls(record, state.run_id, "slow_read")
    wait_until(
        lambda: any(r["event"] == "cancelled" and r["pid"] == made["pid"] and r["t"] > made["t"]
                    for r in records(record)),
        timeout_s=10, what="the server's record of the cancellation",
    )  # fmt: skip


def test_an_mcp_write_is_held_approved_by_digest_and_executed_once(
    *, worker: WorkerProcess, client: Client, queue: str, record: Path, unique: str
) -> None:
    """A write the server does not mark `destructiveHint: false` is irreversible: the run is
    held `needs_approval` before the server is called; approved by its digest, the call runs
    once, under the held key."""
    run_id = client.submit(f"t-{unique}", "u1", "mcp_approve", "open a ticket", queue=queue)
    held = client.wait(run_id, timeout_s=60)
    assert held.outcome is Outcome.NEEDS_APPROVAL and held.pending is not None
    assert held.pending.call.name == "create_ticket"
    assert calls(record, run_id) == []
    client.approve(run_id, by="alice", digest=held.pending.digest)
    state = client.wait(run_id, timeout_s=60)
    assert state.outcome is Outcome.COMPLETED, state.reason
    (made,) = calls(record, run_id, "create_ticket")
    assert made["meta"] == {KEY: held.pending.key, RUN: run_id, "turnstile/approved": True}
    executed = [r for r in records(record) if r["event"] == "executed" and
                r.get("key") == held.pending.key]  # fmt: skip
    assert len(executed) == 1


def test_a_stdio_server_dying_mid_call_is_a_tool_failure_and_the_worker_lives_on(
    *, worker: WorkerProcess, client: Client, queue: str, record: Path, unique: str
) -> None:
    """A stdio server that exits in the middle of each call: each call is a failure the model
    is shown (naming the server and why), the server is started again for the next, and the
    run ends `tool_failure` by its budget; the worker runs the next run as before."""
    state = run(client, queue, f"t-{unique}", "mcp_dies")
    assert state.outcome is Outcome.TOOL_FAILURE, state.reason
    assert state.last_result is not None and state.last_result["code"] == "tool_raised"
    assert "McpUnavailableError: server 'desk': closed its stdout" in state.last_result["detail"]
    assert len({c["pid"] for c in calls(record, state.run_id, "die")}) == 2  # started again
    after = run(client, queue, f"t-{unique}", "mcp_desk")
    assert after.outcome is Outcome.COMPLETED, after.reason


def test_the_mcp_tools_of_jobs_ending_otherwise_are_cut_at_what_the_kernel_keeps(
    *, worker: WorkerProcess, client: Client, queue: str, record: Path, unique: str
) -> None:
    """An answer over the kernel's result bound is a `bad_result` naming its size; a server
    that writes a line that is not JSON-RPC fails that call at once with the line, and the
    next call gets a new server; a tool that clashes with the Python tool `echo` is left out,
    so `echo` is still the Python one. The run completes."""
    state = run(client, queue, f"t-{unique}", "mcp_bad")
    assert state.outcome is Outcome.COMPLETED, state.reason
    events = [e for _, e in client.store.events(f"t-{unique}", state.run_id)]
    results = [e["last_result"] for e in events if e["type"] == "turn"]
    assert results[0]["code"] == "bad_result" and "is over 262144" in results[0]["detail"]
    assert results[1]["code"] == "tool_raised"
    assert ("wrote a line on its stdout that is not a JSON-RPC message: 'this is not JSON-RPC'"
            in results[1]["detail"])  # fmt: skip
    assert results[2] == {"status": "ok", "result": {"order": "A-1", "state": "shipped",
                                                     "carrier": "DHL"}}  # fmt: skip
    assert results[3] == {"status": "ok", "result": "still here"}


def test_a_tool_the_server_adds_is_offered_after_it_says_its_list_changed(
    *, worker: WorkerProcess, client: Client, queue: str, record: Path, unique: str
) -> None:
    """The server adds a tool and says its list changed: a later turn of the same run is
    offered it and calls it."""
    state = run(client, queue, f"t-{unique}", "mcp_grow")
    assert state.outcome is Outcome.COMPLETED, (state.reason, state.last_result)
    results = turn_results(client, state.run_id)
    assert results[0] == {"status": "ok", "result": {"result": "grown"}}
    assert {"status": "ok", "result": {"result": "fresh"}} in results[1:], results
    changed = [e for e in worker.events("mcp_tools_changed") if "fresh" in e["tools"]]
    assert changed, worker.log()[-2000:]


def test_a_per_tenant_server_gets_each_tenants_own_secret_and_none_for_another(
    *, worker: WorkerProcess, client: Client, queue: str, record: Path, unique: str
) -> None:
    """A per-tenant server is called with the token the secrets file gives the run's tenant;
    a tenant the file does not name is offered none of its tools."""
    ok = run(client, queue, "acme", "mcp_tenant")
    assert ok.outcome is Outcome.COMPLETED, ok.reason
    (made,) = calls(record, ok.run_id)
    assert made["token"] == ACME_TOKEN
    other = run(client, queue, f"t-{unique}", "mcp_tenant")
    assert turn_results(client, other.run_id)[0] == {"status": "error", "code": "unknown_tool",
                                                     "detail": "lookup_order"}  # fmt: skip
    assert calls(record, other.run_id) == []
    assert any(e["reason"].startswith("MCP server 'tenanted' is per tenant")
               for e in worker.events("mcp_tool_left_out"))  # fmt: skip


def test_the_worker_says_in_one_line_each_what_it_cannot_offer(
    *, worker: WorkerProcess, client: Client, queue: str
) -> None:
    """Listing the jobs' servers when it starts, the worker says once, in one line each: the
    server that never answers its handshake, the tool whose schema is not JSON Schema, the
    name no model can call, the name of a Python tool; it did not stop."""
    wait_until(lambda: len(worker.events("mcp_tool_left_out")) >= 3, timeout_s=30,
               what=lambda: worker.log()[-3000:])  # fmt: skip
    reasons = [e["reason"] for e in worker.events("mcp_tool_left_out")]
    assert any("'broken_schema'" in r and "not valid JSON Schema" in r for r in reasons), reasons
    assert any("'has space'" in r and "a model cannot call it" in r for r in reasons), reasons
    assert any("'echo'" in r and "has the name of another tool" in r for r in reasons), reasons
    mute = [e for e in worker.events("mcp_server_unavailable") if e["server"] == "mute"]
    assert mute and "did not answer its handshake (initialize) within 2.0 s" in mute[0]["reason"]
    assert all(reasons.count(r) <= 2 for r in reasons)  # once in each of its two processes
    assert worker.process is not None and worker.process.poll() is None


@pytest.mark.slow  # over 10 s on 2 cores: CI runs it in the slow part
def test_turnstile_jobs_shows_the_mcp_tools_and_one_line_for_a_server_that_is_down(
    env: dict[str, str],
) -> None:
    """`turnstile jobs NAME` connects to the job's servers: it lists their tools as the model
    is offered them, the tools left out with why, and a server that does not answer in one
    line."""
    shown = CliRunner().invoke(app, ["jobs", "mcp_bad"], env={**env, "COLUMNS": "250"})
    assert shown.exit_code == 0, shown.output
    out = shown.stdout
    assert "mcp shop (stdio" in out and "tool lookup_order" in out and "read" in out
    assert "left out: MCP tool 'echo' of server 'shop' has the name of another tool" in out
    assert "mcp mute (stdio" in out
    assert "unavailable: did not answer its handshake (initialize) within 2.0 s" in out
    listed = json.loads(CliRunner().invoke(app, ["jobs", "mcp_desk", "--json"], env=env).stdout)
    (server,) = listed["mcp"]
    assert server["status"] == "ok"
    assert [(t["name"], t["mutates"]) for t in server["tools"]] == [
        ("lookup_order", False),
        ("add_note", True),
    ]


def test_a_run_of_mcp_tools_is_not_replayed_against_its_servers(
    *, worker: WorkerProcess, client: Client, queue: str, record: Path, unique: str,
    redis_url: str,
) -> None:  # fmt: skip
    """Replay runs a run's tools again; an MCP server's tools act on its own world, so
    `turnstile replay` refuses a run of MCP tools in one line, and calls no server."""
    state = run(client, queue, f"t-{unique}", "mcp_desk")
    before = len(records(record))
    replayed = CliRunner().invoke(
        app,
        ["replay", state.run_id],
        env={"TURNSTILE_REDIS_URL": redis_url, "TURNSTILE_JOBS": SPEC},
    )
    assert replayed.exit_code == 1, replayed.output
    assert replayed.stderr == (
        "error: the run's job calls MCP servers (desk); replay has a world of one run only\n"
    )
    assert len(records(record)) == before
