"""The HTTP API against a real `turnstile api` process and real Celery workers: submit and
follow a run's events to the end, resume them by Last-Event-ID, approve a held refund, retry
a submit, keep tenants apart, and the operator endpoints."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import msgspec
import pytest
from typer.testing import CliRunner

from tests.integration.apiserver import ApiServer, http, make_key, running_api, sse_events
from tests.integration.workers import (
    WorkerProcess,
    client_for,
    running_workers,
    shop_effects,
    wait_until,
)
from turnstile.jobs.support.scenarios import BY_LETTER, GOAL, USER
from turnstile.worker.cli.main import app
from turnstile.worker.client._client import Client, idempotent_run_id
from turnstile.worker.dev.shop import RedisShop
from turnstile.worker.http.apikeys import Role
from turnstile.worker.store import http_keys, keys

pytestmark = pytest.mark.integration

SLOW = {"sleep_s": {"get_order": 0.3, "send_status_email": 0.3}}


@pytest.fixture(scope="module")
def queue() -> str:
    return f"h-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def pool(redis_url: str, queue: str) -> Iterator[list[WorkerProcess]]:
    with running_workers(redis_url, [queue], 2, prefix="h") as workers:
        yield workers


@pytest.fixture(scope="module")
def api(redis_url: str) -> Iterator[ApiServer]:
    # B's webhook goes to a documentation address, admitted here only: no other server sends to it.
    with running_api(redis_url, {"TURNSTILE_API_WEBHOOK_ALLOW": "192.0.2.0/24"}) as server:
        yield server


@pytest.fixture
def client(redis_url: str, pool: list[WorkerProcess]) -> Client:
    return client_for(redis_url)


def _stored(client: Client, tenant: str, run_id: str) -> list[tuple[str, str]]:
    """(entry id, stored JSON) of every entry of the run's stream, as stored."""
    entries: list[Any] = client.client.xrange(keys.events(tenant, run_id))  # type: ignore[assignment]
    return [(str(eid), str(fields["event"])) for eid, fields in entries]


def _status(client: Client, tenant: str, run_id: str) -> str:
    return client.store.hash(tenant, run_id).get("status", "")


def test_submit_over_http_and_follow_events_to_finished(
    redis_url: str, api: ApiServer, client: Client, queue: str, unique: str
) -> None:
    """A run submitted over HTTP runs on the workers; its SSE stream carries every stored
    event in stored order, with the entry id as `id:` and the stored JSON as data, and
    closes after `finished`."""
    tenant = f"t-{unique}"
    with http(api, make_key(redis_url, tenant)) as web:
        made = web.post(
            "/v1/runs", json={"user": USER, "goal": GOAL, "job": "support", "queue": queue}
        )
        assert made.status_code == 202, made.text
        run_id = made.json()["run_id"]
        assert made.headers["location"] == f"/v1/runs/{run_id}"
        got = sse_events(web, f"/v1/runs/{run_id}/events")
        view = web.get(f"/v1/runs/{run_id}").json()
    assert got[-1][1] == "finished"
    assert [(i, d) for i, _, d in got] == _stored(client, tenant, run_id)
    assert [e for _, e, _ in got] == [json.loads(d)["type"] for _, _, d in got]
    assert (view["status"], view["outcome"], view["tenant"]) == ("stopped", "completed", tenant)


def test_a_dropped_stream_resumes_from_last_event_id(
    redis_url: str, api: ApiServer, client: Client, queue: str, unique: str
) -> None:
    """A client that hangs up after two events and reconnects with the last id it saw gets
    the rest: together the two reads are the stored stream, nothing lost or repeated."""
    tenant = f"t-{unique}"
    with http(api, make_key(redis_url, tenant)) as web:
        body = {"user": USER, "goal": GOAL, "job": "support", "queue": queue, "params": SLOW}
        run_id = web.post("/v1/runs", json=body).json()["run_id"]
        first = sse_events(web, f"/v1/runs/{run_id}/events", stop_after=2)
        rest = sse_events(web, f"/v1/runs/{run_id}/events", last_event_id=first[-1][0])
        again = sse_events(web, f"/v1/runs/{run_id}/events", last_event_id=rest[-1][0])
    assert len(first) == 2 and rest[-1][1] == "finished"
    assert [(i, d) for i, _, d in first + rest] == _stored(client, tenant, run_id)
    assert again == []  # resumed after `finished`, the stream closes at once


def test_a_retried_submit_with_the_same_idempotency_key_returns_the_same_run(
    redis_url: str, api: ApiServer, client: Client, unique: str
) -> None:
    """The same Idempotency-Key gives the same run (one run stored); the same key with another
    body is a conflict; another tenant's same key is another run; a `run_id` in the body is
    such a key too (the run's id is derived from it)."""
    tenant, other = f"t-{unique}", f"o-{unique}"
    body = {"user": USER, "goal": GOAL, "job": "support", "queue": f"idle-{unique}"}
    headers = {"Idempotency-Key": "order-1001-refund"}
    with http(api, make_key(redis_url, tenant)) as web:
        first = web.post("/v1/runs", json=body, headers=headers)
        second = web.post("/v1/runs", json=body, headers=headers)
        changed = web.post("/v1/runs", json={**body, "goal": "other"}, headers=headers)
        by_run_id = web.post("/v1/runs", json={**body, "run_id": f"r-{unique}"})
        by_run_id_again = web.post("/v1/runs", json={**body, "run_id": f"r-{unique}"})
    with http(api, make_key(redis_url, other)) as web:
        theirs = web.post("/v1/runs", json=body, headers=headers)
    assert first.status_code == second.status_code == 202
    assert first.json()["run_id"] == second.json()["run_id"]
    assert (first.json()["created"], second.json()["created"]) == (True, False)
    assert changed.status_code == 409 and changed.json()["code"] == "run_id_conflict"
    assert by_run_id.json()["run_id"] == by_run_id_again.json()["run_id"]
    assert by_run_id.json()["run_id"] == idempotent_run_id(tenant, f"r-{unique}")
    assert theirs.json()["run_id"] != first.json()["run_id"]
    assert client.client.zcard(keys.runs(tenant)) == 2


def test_a_held_refund_is_approved_over_http_once(
    redis_url: str, api: ApiServer, client: Client, queue: str, unique: str
) -> None:
    """Scenario G over HTTP: the run waits with the refund held; the wrong digest is refused;
    the right one is approved (recorded as the key's name); the run completes with one
    refund; a second approval is refused."""
    tenant = f"t-{unique}"
    g = BY_LETTER["G"]
    key = make_key(redis_url, tenant, name=f"desk-{unique}")
    with http(api, key) as web:
        body = {"user": USER, "goal": GOAL, "job": "support", "queue": queue, "params": g.params}
        run_id = web.post("/v1/runs", json=body).json()["run_id"]
        wait_until(lambda: _status(client, tenant, run_id) == "suspended", what="G suspends")
        view = web.get(f"/v1/runs/{run_id}").json()
        assert view["pending"]["tool"] == "issue_refund"
        wrong = web.post(f"/v1/runs/{run_id}/approve", json={"digest": "0" * 16})
        ok = web.post(f"/v1/runs/{run_id}/approve", json={"digest": view["pending"]["digest"]})
        got = sse_events(web, f"/v1/runs/{run_id}/events")
        again = web.post(f"/v1/runs/{run_id}/approve", json={"digest": view["pending"]["digest"]})
    assert wrong.status_code == 409 and wrong.json()["code"] == "decision_refused"
    assert ok.status_code == 200 and ok.json()["by"] == f"desk-{unique}"
    assert again.status_code == 409 and again.json()["code"] == "decision_refused"
    assert got[-1][1] == "finished" and json.loads(got[-1][2])["outcome"] == "completed"
    decisions = [json.loads(d) for _, e, d in got if e == "decision"]
    assert [(d["kind"], d["by"]) for d in decisions] == [("approved", f"desk-{unique}")]
    assert shop_effects(client, run_id) == [
        ["refund", "ord_1004", 8000],
        ["email", "ord_1004"],
    ]


def test_an_empty_digest_approves_nothing_over_http(
    redis_url: str, api: ApiServer, client: Client, queue: str, unique: str
) -> None:
    """An approval whose digest is empty is a 422 saying so, one of blanks a 409 saying the
    digest is empty; the held refund stays held and no decision is recorded."""
    tenant = f"t-{unique}"
    with http(api, make_key(redis_url, tenant)) as web:
        body = {"user": USER, "goal": GOAL, "job": "support", "queue": queue,
                "params": BY_LETTER["G"].params}  # fmt: skip
        run_id = web.post("/v1/runs", json=body).json()["run_id"]
        wait_until(lambda: _status(client, tenant, run_id) == "suspended", what="G suspends")
        empty = web.post(f"/v1/runs/{run_id}/approve", json={"digest": ""})
        blank = web.post(f"/v1/runs/{run_id}/approve", json={"digest": "   "})
    assert (empty.status_code, empty.json()["code"]) == (422, "invalid_request")
    assert empty.json()["detail"] == "digest must not be empty"
    assert (blank.status_code, blank.json()["code"]) == (409, "decision_refused")
    assert "empty digest" in blank.json()["detail"]
    assert _status(client, tenant, run_id) == "suspended"
    assert client.state(run_id).decisions == []


def test_two_tenants_naming_one_shop_each_have_their_own(
    redis_url: str, api: ApiServer, client: Client, queue: str, unique: str
) -> None:
    """Tenants A and B submit the demo job with the same `params.shop`: each run reads its
    tenant's order as new and refunds it once, in its tenant's shop; A's order is refunded
    once, not by B's run as well."""
    shop, ran = f"shared-{unique}", {}
    for tenant in (f"a-{unique}", f"b-{unique}"):
        with http(api, make_key(redis_url, tenant)) as web:
            body = {"user": USER, "goal": GOAL, "job": "support", "queue": queue,
                    "params": {"shop": shop}}  # fmt: skip
            run_id = web.post("/v1/runs", json=body).json()["run_id"]
            got = sse_events(web, f"/v1/runs/{run_id}/events")
        assert json.loads(got[-1][2])["outcome"] == "completed", got[-1]
        ran[tenant] = run_id
    stores = RedisShop(client.client)
    for tenant, run_id in ran.items():
        assert stores.effects(tenant, shop) == [["refund", "ord_1001", 3000], ["email", "ord_1001"]]
        assert stores.orders(tenant, shop)["ord_1001"].refunded_cents == 3000
        assert shop_effects(client, run_id) == stores.effects(tenant, shop)


def _snapshot(client: Client, tenant: str, run_id: str, user: str) -> list[object]:
    """Everything of tenant B that A's key must neither see nor change."""
    return [
        client.store.hash(tenant, run_id),
        _stored(client, tenant, run_id),
        msgspec.to_builtins(client.ledger.read(tenant)),
        [n.text for n in client.notes(tenant, user=user)],
        sorted(client.client.smembers(keys.by_status(tenant, "suspended"))),
        sorted(client.client.smembers(http_keys.tenant_webhooks(tenant))),
    ]


def test_a_tenant_key_sees_and_changes_nothing_of_another_tenant(
    redis_url: str, api: ApiServer, client: Client, queue: str, unique: str
) -> None:
    """With tenant A's key, every endpoint tried on tenant B's suspended run, ledger and memory
    answers as if they did not exist (404 for the run, A's own view otherwise, 403 for an
    operator's view), and B's run, stream, ledger, memory and indexes are unchanged."""
    a, b = f"a-{unique}", f"b-{unique}"
    client.ledger.set_ceiling(b, "cost_microusd", 50_000_000)
    with http(api, make_key(redis_url, b)) as web_b:
        body = {
            "user": USER,
            "goal": GOAL,
            "job": "support",
            "queue": queue,
            "params": BY_LETTER["G"].params,
        }
        run_id = web_b.post("/v1/runs", json=body).json()["run_id"]
        note = {"user": USER, "text": "prefers email about order ord_1004"}
        assert web_b.post("/v1/memory", json=note).status_code == 201
        hook = web_b.post("/v1/webhooks", json={"url": "https://192.0.2.1/hook"}).json()["id"]
    wait_until(lambda: _status(client, b, run_id) == "suspended", what="B's run suspends")
    digest = client.state(run_id).pending.digest  # type: ignore[union-attr]
    before = _snapshot(client, b, run_id, USER)
    with http(api, make_key(redis_url, a)) as web:
        run = f"/v1/runs/{run_id}"
        not_found = [
            web.get(run), web.get(f"{run}/events"),
            web.post(f"{run}/approve", json={"digest": digest}),
            web.post(f"{run}/deny", json={"reason": "no"}), web.post(f"{run}/cancel"),
            web.delete(f"/v1/webhooks/{hook}"),
        ]  # fmt: skip
        forbidden = [
            web.get("/v1/runs", params={"tenant": b}), web.get("/v1/ledger", params={"tenant": b}),
            web.get("/v1/tenants"), web.get("/v1/queues"), web.post(f"/v1/tenants/{b}/pause"),
            web.post(f"/v1/queues/{queue}/drain"),
            web.put(f"/v1/tenants/{b}/ceilings/cost_microusd", json={"value": 1}),
        ]  # fmt: skip
        own_runs = web.get("/v1/runs").json()["runs"]
        suspended = web.get("/v1/runs", params={"status": "suspended"}).json()["runs"]
        own_ledger = web.get("/v1/ledger").json()
        notes = web.get("/v1/memory", params={"user": USER}).json()["notes"]
        forgot = web.delete("/v1/memory", params={"user": USER}).json()["forgotten"]
        hooks = web.get("/v1/webhooks").json()["webhooks"]
        theirs = {"user": USER, "goal": GOAL, "job": "support", "run_id": run_id,
                  "queue": f"idle-{unique}"}  # fmt: skip
        taken = web.post("/v1/runs", json=theirs)
        # A's run for B's user, with a goal that matches B's note, recalls nothing of it.
        body = {"user": USER, "goal": "email about ord_1004", "job": "support",
                "queue": f"idle-{unique}"}  # fmt: skip
        mine = web.post("/v1/runs", json=body).json()["run_id"]
    assert [r.status_code for r in not_found] == [404] * 6
    assert {r.json()["code"] for r in not_found} == {"run_not_found", "webhook_not_found"}
    assert [r.status_code for r in forbidden] == [403] * 7
    assert own_runs == suspended == [] and own_ledger == {"tenant": a, "dimensions": {}}
    assert notes == [] and forgot == 0 and hooks == []
    # B's run id in A's submission names a run of A's own: answered as any new key would be.
    assert taken.status_code == 202 and taken.json()["run_id"] != run_id
    assert client.state(mine).memory == []
    assert _snapshot(client, b, run_id, USER) == before


def test_operator_keys_act_across_tenants(
    redis_url: str, api: ApiServer, client: Client, queue: str, unique: str
) -> None:
    """An operator key reads any tenant's run and ledger, sets a ceiling, lists tenants and
    queues, and pauses and resumes a tenant (resuming it again changes nothing); a run held
    for a person is cancelled by it, recorded by its name."""
    tenant = f"t-{unique}"
    client.ledger.set_ceiling(tenant, "steps", 1000)
    with http(api, make_key(redis_url, tenant)) as web:
        body = {
            "user": USER,
            "goal": GOAL,
            "job": "support",
            "queue": queue,
            "params": BY_LETTER["G"].params,
        }
        run_id = web.post("/v1/runs", json=body).json()["run_id"]
    wait_until(lambda: _status(client, tenant, run_id) == "suspended", what="G suspends")
    op = make_key(redis_url, "ops", Role.OPERATOR, name=f"op-{unique}")
    with http(api, op) as web:
        view = web.get(f"/v1/runs/{run_id}")
        capped = web.put(f"/v1/tenants/{tenant}/ceilings/tokens", json={"value": 90_000})
        ledger = web.get("/v1/ledger", params={"tenant": tenant}).json()
        tenants = {t["tenant"]: t for t in web.get("/v1/tenants").json()["tenants"]}
        queues = {q["name"] for q in web.get("/v1/queues").json()["queues"]}
        paused = web.post(f"/v1/tenants/{tenant}/pause")
        unknown = web.post(f"/v1/tenants/nobody-{unique}/pause")
        resumed = web.post(f"/v1/tenants/{tenant}/resume", json={"by": "alice"})
        not_paused = web.post(f"/v1/tenants/{tenant}/resume")
        cancelled = web.post(f"/v1/runs/{run_id}/cancel", json={"reason": "customer called"})
    assert view.status_code == 200 and view.json()["tenant"] == tenant
    assert ledger["dimensions"]["steps"]["ceiling"] == 1000
    assert capped.status_code == 200 and ledger["dimensions"]["tokens"]["ceiling"] == 90_000
    assert tenants[tenant]["dimensions"]["steps"]["ceiling"] == 1000 and queue in queues
    assert paused.json()["by"] == f"op-{unique}" and resumed.json()["cleared"] == ["paused"]
    assert resumed.json()["by"] == f"op-{unique} (alice)"
    assert unknown.status_code == 404
    assert not_paused.status_code == 200 and not_paused.json()["cleared"] == []
    assert cancelled.json()["result"] == "cancelled" and cancelled.json()["outcome"] == "cancelled"
    events = [e for _, e in client.store.events(tenant, run_id) if e["type"] == "decision"]
    assert (events[-1]["kind"], events[-1]["by"]) == ("cancelled", f"op-{unique}")


def test_runs_are_listed_page_by_page_by_cursor(
    redis_url: str, api: ApiServer, unique: str
) -> None:
    """Seven runs, pages of three: newest first without a filter, by index scan with a status;
    every run comes exactly once either way, and a made-up cursor is a 400."""
    tenant = f"t-{unique}"
    with http(api, make_key(redis_url, tenant)) as web:
        body = {"user": USER, "goal": GOAL, "job": "support", "queue": f"idle-{unique}"}
        made = [web.post("/v1/runs", json=body).json()["run_id"] for _ in range(7)]

        def walk(params: dict[str, str]) -> list[list[str]]:
            pages, cursor = [], None
            while True:
                page = web.get(
                    "/v1/runs",
                    params={**params, "limit": "3", **({"cursor": cursor} if cursor else {})},
                )
                pages.append([r["run_id"] for r in page.json()["runs"]])
                cursor = page.json()["next_cursor"]
                if cursor is None:
                    return pages

        newest = walk({})
        running = walk({"status": "running"})
        bad = web.get("/v1/runs", params={"cursor": "zzz"})
        wrong_status = web.get("/v1/runs", params={"status": "sleeping"})
    assert [len(p) for p in newest] == [3, 3, 1]
    assert [r for p in newest for r in p] == list(reversed(made))
    assert sorted([r for p in running for r in p]) == sorted(made)
    assert bad.status_code == 400 and bad.json()["code"] == "invalid_cursor"
    assert wrong_status.status_code == 422


def test_a_page_over_http_is_the_page_turnstile_runs_gives(
    redis_url: str, api: ApiServer, unique: str
) -> None:
    """`GET /v1/runs` and `turnstile runs --json` page through one listing: for the same
    tenant and limit they give the same rows, field for field, and the same next cursor."""
    tenant = f"t-{unique}"
    with http(api, make_key(redis_url, tenant)) as web:
        body = {"user": USER, "goal": GOAL, "job": "support", "queue": f"idle-{unique}"}
        for _ in range(3):
            web.post("/v1/runs", json=body)
        over_http = web.get("/v1/runs", params={"limit": "2"}).json()
    listed = CliRunner().invoke(
        app, ["runs", "--tenant", tenant, "--limit", "2", "--json"],
        env={"TURNSTILE_REDIS_URL": redis_url},
    )  # fmt: skip
    assert listed.exit_code == 0, listed.output
    assert len(over_http["runs"]) == 2 and over_http["next_cursor"] is not None
    assert json.loads(listed.stdout) == over_http


def test_many_followers_of_a_quiet_run_hold_up_no_other_request(
    redis_url: str, api: ApiServer, unique: str
) -> None:
    """Sixty SSE streams open on a run that does not move (its queue has no worker), twenty
    per key (each key's cap): a submit and a read still answer at once, as the followers wait
    on the event loop, not on the server's threads (of which there are forty)."""
    tenant = f"t-{unique}"
    key, *followers = [make_key(redis_url, tenant) for _ in range(3)]
    body = {"user": USER, "goal": GOAL, "job": "support", "queue": f"idle-{unique}"}
    with http(api, key) as web:
        run_id = web.post("/v1/runs", json=body).json()["run_id"]

    async def follow_and_submit() -> tuple[int, float]:
        headers = {"Authorization": f"Bearer {key}"}
        async with httpx.AsyncClient(base_url=api.url, headers=headers, timeout=30) as aweb:
            replies = [
                await aweb.send(aweb.build_request("GET", f"/v1/runs/{run_id}/events",
                                                   headers={"Authorization": f"Bearer {k}"}),
                                stream=True)
                for k in (key, *followers) for _ in range(20)
            ]  # fmt: skip
            try:
                assert {r.status_code for r in replies} == {200}
                started = time.monotonic()
                made = await aweb.post("/v1/runs", json=body)
                read = await aweb.get(f"/v1/runs/{made.json()['run_id']}")
                return read.status_code, time.monotonic() - started
            finally:
                for reply in replies:
                    await reply.aclose()

    status, took_s = asyncio.run(follow_and_submit())
    assert status == 200 and took_s < 3.0
