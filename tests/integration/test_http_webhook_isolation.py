"""Webhooks between tenants, against real `turnstile api` processes, real Celery workers and
receivers that are real servers: one tenant's endpoints that never answer hold a bounded part
of the delivery pool, so another tenant's delivery stays on time; an endpoint that keeps
timing out is backed off by its breaker and delivers again when it answers; the cap on a
tenant's endpoints holds under concurrent registrations."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import msgspec
import pytest

from tests.integration.apiserver import http, make_key, running_api
from tests.integration.receivers import FAST, Hanging, Receiver, hanging, receiving
from tests.integration.workers import WorkerProcess, client_for, running_workers, wait_until
from turnstile.jobs.support.scenarios import GOAL, USER
from turnstile.worker.http.routes_webhooks import MAX_ENDPOINTS
from turnstile.worker.store import http_keys
from turnstile.worker.store.webhooks import Endpoint

pytestmark = pytest.mark.integration

TIMEOUT_S = 3.0  # the delivery timeout the finding was measured with
SLOW_ENDPOINTS = 20  # the tenant's whole allowance, every one of them silent
SLOW_RUNS = 10


@pytest.fixture(scope="module")
def queue() -> str:
    return f"wi-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def pool(redis_url: str, queue: str) -> Iterator[list[WorkerProcess]]:
    with running_workers(redis_url, [queue], 2, prefix="wi") as workers:
        yield workers


def _finish_runs(web: httpx.Client, redis_url: str, tenant: str, queue: str, n: int) -> list[str]:
    """Submit `n` runs for the key's tenant and wait until every one has finished."""
    body = {"user": USER, "goal": GOAL, "job": "support", "queue": queue}
    ids = [str(web.post("/v1/runs", json=body).json()["run_id"]) for _ in range(n)]
    store = client_for(redis_url).store
    wait_until(
        lambda: all(store.hash(tenant, r).get("status") == "stopped" for r in ids),
        what="runs finish",
    )
    return ids


def _register(web: httpx.Client, url: str) -> str:
    made = web.post("/v1/webhooks", json={"url": url, "events": ["run.finished"]})
    assert made.status_code == 201, made.text
    return str(made.json()["id"])


def _last(web: httpx.Client) -> dict[str, Any]:
    listed = web.get("/v1/webhooks").json()["webhooks"]
    return dict(listed[0]["last_delivery"] or {}) if listed else {}


def test_a_tenants_silent_endpoints_do_not_delay_another_tenants_delivery(
    redis_url: str, pool: list[WorkerProcess], queue: str, unique: str
) -> None:
    """With tenant S's 20 endpoints that accept and never answer and S's finished runs piling
    deliveries up for them, tenant V's `run.finished` reaches V's receiver within the
    delivery timeout plus 1 s of the event's commit."""
    slow, prompt = f"s-{unique}", f"v-{unique}"
    env = {**FAST, "TURNSTILE_API_WEBHOOK_TIMEOUT_S": str(TIMEOUT_S)}
    with (
        hanging(Hanging()) as sink,
        receiving(Receiver()) as receiver,
        running_api(redis_url, env) as api,
        http(api, make_key(redis_url, slow)) as web_s,
        http(api, make_key(redis_url, prompt)) as web_v,
    ):
        silent = [_register(web_s, sink.url(f"hook/{i}")) for i in range(SLOW_ENDPOINTS)]
        _finish_runs(web_s, redis_url, slow, queue, SLOW_RUNS)
        wait_until(lambda: len(sink.accepted) >= 4, what="S's deliveries under way")
        _register(web_v, receiver.url)
        [run_id] = _finish_runs(web_v, redis_url, prompt, queue, 1)
        wait_until(lambda: receiver.got != [], what="V's delivery", timeout_s=120)
        silent_tries = len(sink.accepted)
        logged = api.log()
        for endpoint in silent:  # their deliveries go with them, not to the next test's server
            web_s.delete(f"/v1/webhooks/{endpoint}")
    [delivered] = receiver.bodies("run.finished")
    committed_s = int(str(delivered["event_id"]).split("-")[0]) / 1000
    lateness_s = receiver.at[0] - committed_s
    print(f"\nV's run.finished arrived {lateness_s:.2f} s after its commit (timeout "
          f"{TIMEOUT_S} s); S's silent endpoints had taken {silent_tries} connections")  # fmt: skip
    assert delivered["run_id"] == run_id
    assert lateness_s <= TIMEOUT_S + 1.0
    assert "Traceback" not in logged and "webhook_attempt_failed" not in logged


def _silent_tries(
    redis_url: str, queue: str, tenant: str, env: dict[str, str], *, window_s: float
) -> int:
    """Connections a silent endpoint of `tenant` takes in `window_s` from its first, with
    eight finished runs to deliver, under a server with `env`; the endpoint is removed after."""
    with (
        hanging(Hanging()) as sink,
        running_api(redis_url, env) as api,
        http(api, make_key(redis_url, tenant)) as web,
    ):
        endpoint = _register(web, sink.url())
        _finish_runs(web, redis_url, tenant, queue, 8)
        tries = _tries_in(sink, window_s)
        web.delete(f"/v1/webhooks/{endpoint}")
    return tries


def _tries_in(sink: Hanging, window_s: float) -> int:
    """Connections `sink` takes in `window_s` from its first (waited for)."""
    wait_until(lambda: sink.accepted != [], what="a first try")
    time.sleep(max(0.0, sink.accepted[0] + window_s - time.time()))
    return sum(1 for at in list(sink.accepted) if at - sink.accepted[0] < window_s)


BREAKER = {"TURNSTILE_API_WEBHOOK_BREAKER_FAILURES": "2",
           "TURNSTILE_API_WEBHOOK_BREAKER_COOLDOWN_S": "2"}  # fmt: skip


@pytest.mark.slow  # over 14 s on 2 cores: CI runs it in the slow part
def test_a_silent_endpoint_is_backed_off_and_delivers_again_when_it_answers(
    redis_url: str, pool: list[WorkerProcess], queue: str, unique: str
) -> None:
    """An endpoint that never answers takes far fewer connections over a window with its
    breaker (2 failures, 2 s cool-down) than without one; the open breaker shows in its last
    delivery, and once the endpoint answers again every run's `run.finished` reaches it and
    the breaker is closed."""
    env = {**FAST, "TURNSTILE_API_WEBHOOK_TIMEOUT_S": "1"}
    window_s = 8.0
    unbroken = _silent_tries(redis_url, queue, f"u-{unique}", {**env, **{
        "TURNSTILE_API_WEBHOOK_BREAKER_FAILURES": "1000000"}}, window_s=window_s)  # fmt: skip
    tenant = f"b-{unique}"
    with (
        running_api(redis_url, {**env, **BREAKER}) as api,
        http(api, make_key(redis_url, tenant)) as web,
    ):
        with hanging(Hanging()) as sink:
            port = sink.port_taken
            endpoint = _register(web, sink.url())
            ids = _finish_runs(web, redis_url, tenant, queue, 8)
            broken = _tries_in(sink, window_s)
            opened = _last(web)
        with receiving(Receiver(port=port)) as receiver:
            wait_until(
                lambda: {b["run_id"] for b in receiver.bodies()} == set(ids),
                what="every run delivered after the endpoint answers", timeout_s=30,
            )  # fmt: skip
            wait_until(lambda: _last(web).get("circuit") == "closed", what="closed")
            closed = _last(web)
        web.delete(f"/v1/webhooks/{endpoint}")
        logged = api.log()
    print(f"\nsilent endpoint's tries in {window_s} s: {unbroken} without a breaker, "
          f"{broken} with one")  # fmt: skip
    assert broken * 2 < unbroken, (broken, unbroken)
    assert opened["circuit"] == "open" and opened["result"] == "retrying", opened
    assert closed["result"] == "delivered" and closed["consecutive_failures"] == 0
    assert "webhook_circuit_opened" in logged and "webhook_circuit_closed" in logged
    assert "Traceback" not in logged and "webhook_attempt_failed" not in logged


def test_concurrent_registrations_store_exactly_the_cap(redis_url: str, unique: str) -> None:
    """100 registrations at once for one tenant store exactly the cap of endpoints (listed,
    counted and kept); every other one is a 409 problem document and leaves nothing behind."""
    tenant = f"c-{unique}"
    env = {"TURNSTILE_API_WEBHOOK_ALLOW": "127.0.0.1"}
    with running_api(redis_url, env) as api, http(api, make_key(redis_url, tenant)) as web:
        body = {"url": "http://127.0.0.1:9/hook", "events": ["run.finished"]}
        with ThreadPoolExecutor(100) as threads:
            replies = list(threads.map(lambda _: web.post("/v1/webhooks", json=body), range(100)))
        listed = web.get("/v1/webhooks").json()["webhooks"]
        r = client_for(redis_url).client
        records = [msgspec.json.decode(v, type=Endpoint) for v in r.hvals(http_keys.WEBHOOKS)]
        counted = r.scard(http_keys.tenant_webhooks(tenant))
        for endpoint in listed:
            web.delete(f"/v1/webhooks/{endpoint['id']}")
    made = [x for x in replies if x.status_code == 201]
    refused = [x for x in replies if x.status_code != 201]
    print(f"\n{len(made)} of 100 concurrent registrations stored (cap {MAX_ENDPOINTS})")
    assert len(made) == MAX_ENDPOINTS and len(listed) == MAX_ENDPOINTS
    assert counted == MAX_ENDPOINTS
    assert sorted(e.id for e in records if e.tenant == tenant) == sorted(x["id"] for x in listed)
    assert {x.status_code for x in refused} == {409}
    assert {x.headers["content-type"] for x in refused} == {"application/problem+json"}
    assert {x.json()["code"] for x in refused} == {"too_many_webhooks"}
    assert all(x.json()["title"] and "at most 20" in x.json()["detail"] for x in refused)


def test_deliveries_held_back_by_an_open_breaker_are_given_up_after_their_retry_time(
    redis_url: str, pool: list[WorkerProcess], queue: str, unique: str
) -> None:
    """With the breaker open after one failure for longer than the retry time, the deliveries
    it holds back are never sent, and once past the retry time each ends `gave_up` with the
    reason in the endpoint's last delivery; its outbox is left empty."""
    tenant = f"g-{unique}"
    env = {**FAST, "TURNSTILE_API_WEBHOOK_TIMEOUT_S": "1", "TURNSTILE_API_WEBHOOK_RETRY_FOR_S": "3",
           "TURNSTILE_API_WEBHOOK_TENANT_CONCURRENCY": "1",
           "TURNSTILE_API_WEBHOOK_BREAKER_FAILURES": "1",
           "TURNSTILE_API_WEBHOOK_BREAKER_COOLDOWN_S": "600"}  # fmt: skip
    with (
        hanging(Hanging()) as sink,
        running_api(redis_url, env) as api,
        http(api, make_key(redis_url, tenant)) as web,
    ):
        endpoint = _register(web, sink.url())
        _finish_runs(web, redis_url, tenant, queue, 3)
        r = client_for(redis_url).client
        outbox = http_keys.outbox(tenant, endpoint)
        wait_until(lambda: sink.accepted != [], what="the first try")
        wait_until(lambda: r.zcard(outbox) == 0, what="every delivery ended", timeout_s=30)
        last = _last(web)
        logged = api.log()
        web.delete(f"/v1/webhooks/{endpoint}")
    attempts = [e for e in _events(logged)
                if e.get("event") == "webhook_attempt" and e.get("tenant") == tenant]  # fmt: skip
    assert len(sink.accepted) == 1  # the one failure that opened it; nothing after
    assert (last["result"], last["circuit"], last["status_code"]) == ("gave_up", "open", 0)
    assert last["error"] == "not sent: the endpoint's breaker is open (failed attempts in a row: 1)"
    assert sorted(e["result"] for e in attempts) == ["gave_up"] * 3 + ["retrying"]


def _events(log: str) -> list[dict[str, Any]]:
    """The JSON log lines of a server's log."""
    return [json.loads(line) for line in log.splitlines() if line.startswith("{")]
