"""`turnstile mcp`, driven end to end by the `mcp` package's own client: over stdio and over
streamable HTTP, an MCP client submits a run, waits for it, finds its held call, approves it by
digest and waits for the end; over HTTP a tenant's key cannot reach another tenant's runs, and
a request without a key is refused."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from tests.integration.workers import client_for, running_workers
from turnstile.worker.client._client import Client as TurnstileClient
from turnstile.worker.http import apikeys

pytestmark = pytest.mark.integration

ROOT = Path(__file__).parents[2]
TURNSTILE = str(Path(sys.executable).parent / "turnstile")
SPEC = "tests.mcp_jobs:notice"
WINDOW_S = 3600  # the submission limit's window: the test waits out one about to end
TOOLS = ["submit_run", "get_run", "run_events", "wait_run", "approve_call", "deny_call"]


@pytest.fixture(scope="module")
def queue() -> str:
    return "mcp-server"


@pytest.fixture(scope="module")
def worker(redis_url: str, queue: str) -> Iterator[None]:
    with running_workers(redis_url, [queue], 1, env={"TURNSTILE_JOBS": SPEC}):
        yield


def server_env(redis_url: str) -> dict[str, str]:
    return {"TURNSTILE_REDIS_URL": redis_url, "TURNSTILE_JOBS": SPEC, "PYTHONPATH": str(ROOT)}


async def tool(client: Client, name: str, **args: Any) -> Any:
    """The tool's structured result; an error result as ("error", its text, after the SDK's
    "Error executing tool NAME: ")."""
    result = await client.call_tool(name, args)
    if result.is_error:
        said = " ".join(getattr(b, "text", "") for b in result.content)
        return "error", said.removeprefix(f"Error executing tool {name}: ")
    return result.structured_content


async def held_and_approved(client: Client, queue: str) -> tuple[str, Any, Any, Any]:
    """Submit a notice run, wait until it holds its call, approve that by digest, wait for
    the end: the run id, the held view, the ended view and the events."""
    made = await tool(client, "submit_run", job="notice", goal="tell them we close",
                      user="u1", queue=queue)  # fmt: skip
    run_id = made["run_id"]
    held = await tool(client, "wait_run", run_id=run_id, timeout_s=60)
    assert held["waited"] == "settled" and held["outcome"] == "needs_approval", held
    approved = await tool(client, "approve_call", run_id=run_id,
                          digest=held["pending"]["digest"])  # fmt: skip
    assert approved["decisions"][-1]["kind"] == "approved", approved
    ended = await tool(client, "wait_run", run_id=run_id, timeout_s=60)
    events = await tool(client, "run_events", run_id=run_id)
    return run_id, held, ended, events


def test_an_mcp_client_over_stdio_submits_waits_and_approves(
    redis_url: str, worker: None, queue: str, unique: str
) -> None:
    """Over stdio, as the tenant the operator named: the six tools are listed; a run is
    submitted, its held call approved by digest (recorded as `--by`) and it completes; an
    unknown job and an unknown run are one-line error results, and the server goes on."""
    tenant = f"t-{unique}"
    params = StdioServerParameters(
        command=TURNSTILE, args=["mcp", "--tenant", tenant, "--by", "alice"],
        env=server_env(redis_url), cwd=str(ROOT),
    )  # fmt: skip

    async def main() -> None:
        async with Client(params) as client:
            listed = await client.list_tools()
            assert [t.name for t in listed.tools] == TOOLS
            run_id, held, ended, events = await held_and_approved(client, queue)
            assert held["tenant"] == tenant and held["pending"]["tool"] == "post_notice"
            assert ended["outcome"] == "completed" and ended["answer"] == "posted"
            kinds = [e["type"] for e in events["events"]]
            assert kinds[0] == "submitted" and kinds[-1] == "finished" and "decision" in kinds
            decision = next(e for e in events["events"] if e["type"] == "decision")
            assert decision["by"] == "alice"
            kind, said = await tool(client, "submit_run", job="nope", goal="g", user="u1")
            assert kind == "error" and "unknown job 'nope'" in said and "\n" not in said
            assert await tool(client, "get_run", run_id="run_missing") == (
                "error",
                "no run 'run_missing'",
            )
            assert (await tool(client, "get_run", run_id=run_id))["status"] == "stopped"

    anyio.run(main)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


@pytest.fixture
def http_server(redis_url: str) -> Iterator[str]:
    """`turnstile mcp --http` in a process of its own; its URL."""
    port = _free_port()
    env = {**server_env(redis_url), "TURNSTILE_API_SUBMITS_PER_WINDOW": "2",
           "TURNSTILE_API_RATE_WINDOW_S": str(WINDOW_S)}  # fmt: skip
    process = subprocess.Popen(
        [TURNSTILE, "mcp", "--http", "--port", str(port)], env=env,
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                httpx.post(url, timeout=1)
                break
            except httpx.TransportError:
                assert process.poll() is None, process.stderr.read() if process.stderr else ""
                time.sleep(0.2)
        yield url
    finally:
        process.kill()
        process.wait(10)
        if process.stderr is not None:
            process.stderr.close()


@asynccontextmanager
async def keyed(url: str, secret: str) -> AsyncIterator[Client]:
    headers = {"Authorization": f"Bearer {secret}"}
    async with (
        create_mcp_http_client(headers=headers) as http,
        Client(streamable_http_client(url, http_client=http)) as client,
    ):
        yield client


def test_over_http_a_tenants_key_runs_its_own_and_cannot_reach_anothers(
    redis_url: str, worker: None, queue: str, http_server: str, unique: str
) -> None:
    """Over streamable HTTP, tenant A's key submits, waits and approves (recorded as its key's
    name); tenant B's key finds none of A's runs, cannot wait for, read the events of, approve
    or deny it; an operator key reaches it; a key's submissions are limited as over the HTTP
    API; a request without a key, or with a revoked one, is a 401 problem."""
    left_s = WINDOW_S - time.time() % WINDOW_S
    if left_s < 60:  # the limit's fixed window would end mid-test
        time.sleep(left_s)
    store: TurnstileClient = client_for(redis_url)
    a_key, a_secret = apikeys.create(store.client, tenant=f"a-{unique}", name=f"ana-{unique}")
    _, b_secret = apikeys.create(store.client, tenant=f"b-{unique}")
    _, op_secret = apikeys.create(store.client, tenant="ops", role=apikeys.Role.OPERATOR)

    async def main() -> str:
        async with keyed(http_server, a_secret) as a:
            run_id, held, ended, events = await held_and_approved(a, queue)
            assert held["tenant"] == f"a-{unique}" and ended["outcome"] == "completed"
            decision = next(e for e in events["events"] if e["type"] == "decision")
            assert decision["by"] == a_key.name
            again = {"job": "notice", "goal": "again", "user": "u1", "queue": queue}
            assert "run_id" in await tool(a, "submit_run", **again)
            assert await tool(a, "submit_run", **again) == (
                "error",
                f"2 submissions in this {WINDOW_S} s window; the limit is 2",
            )
        async with keyed(http_server, b_secret) as b:
            missing = ("error", f"no run {run_id!r}")
            assert await tool(b, "get_run", run_id=run_id) == missing
            assert await tool(b, "wait_run", run_id=run_id, timeout_s=1) == missing
            assert await tool(b, "run_events", run_id=run_id) == missing
            assert await tool(b, "approve_call", run_id=run_id, digest="x") == missing
            assert await tool(b, "deny_call", run_id=run_id, reason="no") == missing
        async with keyed(http_server, op_secret) as op:
            assert (await tool(op, "get_run", run_id=run_id))["outcome"] == "completed"
        return run_id

    anyio.run(main)
    bare = httpx.post(http_server, json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
    assert bare.status_code == 401 and bare.json()["title"] == "missing_key"
    apikeys.revoke(store.client, a_key.id)
    revoked = httpx.post(http_server, json={}, headers={"Authorization": f"Bearer {a_secret}"})
    assert revoked.status_code == 401 and revoked.json()["title"] == "invalid_key"
