"""Operator listings page through the indexes: every run once, newest first across tenants,
with a cursor; a page loads only its own runs. Each test owns its server (a listing without a
tenant covers every tenant on it). No worker consumes the queue: the runs are created by
`submit` and some are ended by the store's own `fail_run`."""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis
from typer.testing import CliRunner

from tests.integration.workers import client_for
from turnstile.jobs.support.scenarios import GOAL, USER
from turnstile.worker.cli.main import app
from turnstile.worker.client._client import Client
from turnstile.worker.dev.embedded import EmbeddedServer
from turnstile.worker.ops import listing

pytestmark = pytest.mark.integration


def _make_runs(client: Client, tenants: list[str], per_tenant: int, queue: str) -> list[str]:
    ids = []
    for i in range(per_tenant):
        for tenant in tenants:
            ids.append(client.submit(tenant, USER, "support", GOAL, {}, queue=queue))
            if i % 3 == 0:
                client.store.fail_run(tenant, ids[-1], "ended for the test")
    return ids


def _order(client: Client, ids: list[str]) -> list[str]:
    """The ids newest first, as a listing orders them: (created ms, tenant, id) descending."""
    keyed = []
    for run_id in ids:
        tenant, stored = client.run_hash(run_id)
        keyed.append((int(stored["created_ms"]), tenant, run_id))
    return [run_id for _, _, run_id in sorted(keyed, reverse=True)]


def _all_pages(client: Client, **filters: Any) -> tuple[list[str], int]:
    """Every run id a listing gives, following cursors to the end, and how many pages."""
    got: list[str] = []
    cursor, pages = None, 0
    while True:
        page = listing.page_runs(client, cursor=cursor, **filters)
        got += [r.run_id for r in page.rows]
        pages += 1
        if page.next_cursor is None:
            return got, pages
        cursor = page.next_cursor


def _hgetall_calls(r: redis.Redis) -> int:
    return int(r.info("commandstats").get("cmdstat_hgetall", {}).get("calls", 0))


def test_pages_give_every_run_once_newest_first_across_tenants(
    own_server: EmbeddedServer, unique: str
) -> None:
    """Forty-two runs over three tenants, listed seven at a time: each run comes exactly once, in
    the listing's order, across tenants; runs created in the same millisecond are not lost."""
    client = client_for(own_server.url)
    tenants = [f"a-{unique}", f"b-{unique}", f"c-{unique}"]
    ids = _make_runs(client, tenants, 14, f"q-{unique}")
    got, pages = _all_pages(client, limit=7)
    assert got == _order(client, ids)
    assert pages == 6

    one, _ = _all_pages(client, tenant=tenants[1], limit=4)
    assert one == _order(client, [r for r in ids if client.tenant_of(r) == tenants[1]])


def test_filtered_pages_from_a_small_index_and_from_a_walk_agree(
    own_server: EmbeddedServer, unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A status or outcome filter pages the same runs in the same order whether the filter's
    index is read whole or the runs index is walked a few runs per page (short pages then)."""
    client = client_for(own_server.url)
    tenants = [f"a-{unique}", f"b-{unique}"]
    ids = _make_runs(client, tenants, 12, f"q-{unique}")
    stopped = _order(client, [r for r in ids if client.run_hash(r)[1]["status"] == "stopped"])
    running = _order(client, [r for r in ids if r not in stopped])
    assert len(stopped) == 8 and len(running) == 16

    assert _all_pages(client, status="stopped", limit=3)[0] == stopped
    assert _all_pages(client, outcome="error", status="stopped", limit=5)[0] == stopped
    assert _all_pages(client, status="running", limit=100)[0] == running

    monkeypatch.setattr(listing, "SMALL_INDEX", 0)
    monkeypatch.setattr(listing, "WALK_CHUNK", 2)
    monkeypatch.setattr(listing, "WALK_BUDGET", 4)
    walked, pages = _all_pages(client, status="stopped", limit=3)
    assert walked == stopped
    assert pages > 3  # the walk's budget made short pages
    assert _all_pages(client, outcome="error", limit=2)[0] == stopped


def test_a_page_loads_only_its_own_runs(own_server: EmbeddedServer, unique: str) -> None:
    """Listing five of sixty runs, filtered or not, reads five run hashes, not sixty."""
    client = client_for(own_server.url)
    _make_runs(client, [f"t-{unique}"], 60, f"q-{unique}")
    for filters in ({}, {"status": "running"}, {"status": "stopped"}):
        client.client.config_resetstat()
        page = listing.page_runs(client, limit=5, **filters)
        assert len(page.rows) == 5 and page.next_cursor is not None
        assert _hgetall_calls(client.client) == 5, filters


def test_runs_command_pages_with_limit_and_cursor(own_server: EmbeddedServer, unique: str) -> None:
    """`turnstile runs --limit N --json` gives a next_cursor that `--cursor` (or
    TURNSTILE_CURSOR) continues from, until it is null; a bad cursor is one clear line."""
    client = client_for(own_server.url)
    tenant = f"t-{unique}"
    ids = _make_runs(client, [tenant], 9, f"q-{unique}")
    runner = CliRunner()
    env = {"TURNSTILE_REDIS_URL": own_server.url}
    got: list[str] = []
    args = ["runs", "--tenant", tenant, "--limit", "4", "--json"]
    cursor_env: dict[str, str] = {}
    while True:
        result = runner.invoke(app, args, env={**env, **cursor_env})
        assert result.exit_code == 0, result.output
        page = json.loads(result.stdout)
        got += [r["run_id"] for r in page["runs"]]
        if page["next_cursor"] is None:
            break
        cursor_env = {"TURNSTILE_CURSOR": page["next_cursor"]}
    assert got == _order(client, ids)
    table = runner.invoke(app, ["runs", "--tenant", tenant, "--limit", "2"], env=env)
    assert table.exit_code == 0 and "more: --cursor " in table.stdout
    bad = runner.invoke(app, [*args, "--cursor", "nonsense"], env=env)
    assert bad.exit_code == 1 and bad.stderr.startswith("error: bad cursor")
    assert "Traceback" not in bad.output
