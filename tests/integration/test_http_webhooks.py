"""Webhooks against a real `turnstile api` process, real Celery workers and receivers that are
real HTTP servers started here: signed deliveries of `run.needs_approval` and `run.finished`,
retries after a 500, and an endpoint that never answers holding nothing back."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator

import pytest

from tests.integration.apiserver import ApiServer, http, make_key, running_api
from tests.integration.receivers import FAST, Receiver, receiving
from tests.integration.workers import WorkerProcess, client_for, running_workers, wait_until
from turnstile.jobs.support.scenarios import BY_LETTER, GOAL, USER
from turnstile.worker.client._client import Client
from turnstile.worker.http.routes_webhooks import SIGNATURE_HEADER, TIMESTAMP_HEADER, verify
from turnstile.worker.store import http_keys

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def queue() -> str:
    return f"wh-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def pool(redis_url: str, queue: str) -> Iterator[list[WorkerProcess]]:
    with running_workers(redis_url, [queue], 2, prefix="wh") as workers:
        yield workers


@pytest.fixture(scope="module")
def api(redis_url: str) -> Iterator[ApiServer]:
    with running_api(redis_url, FAST) as server:
        yield server


@pytest.fixture
def client(redis_url: str, pool: list[WorkerProcess]) -> Client:
    return client_for(redis_url)


def _signed(receiver: Receiver, secret: str) -> bool:
    """Every request the receiver got carries a valid, recent signature."""
    for headers, body in list(receiver.got):
        timestamp = headers[TIMESTAMP_HEADER.lower()]
        if abs(time.time() - int(timestamp)) > 300:
            return False
        if not verify(secret, timestamp, body, headers[SIGNATURE_HEADER.lower()]):
            return False
    return True


def test_a_receiver_gets_needs_approval_and_finished_signed(
    redis_url: str, api: ApiServer, client: Client, queue: str, unique: str
) -> None:
    """A tenant's endpoint gets `run.needs_approval` with the held call's digest when G
    waits, and `run.finished` after it is approved, each signed over timestamp.body with the
    secret shown at registration; another tenant's run is not sent to it; the endpoint's last
    delivery is listed, its secret never."""
    tenant, other = f"t-{unique}", f"o-{unique}"
    with receiving(Receiver()) as receiver, http(api, make_key(redis_url, tenant)) as web:
        made = web.post("/v1/webhooks", json={"url": receiver.url})
        assert made.status_code == 201, made.text
        secret = made.json()["secret"]
        with http(api, make_key(redis_url, other)) as web_other:
            web_other.post(
                "/v1/runs", json={"user": USER, "goal": GOAL, "job": "support", "queue": queue}
            )
        body = {
            "user": USER,
            "goal": GOAL,
            "job": "support",
            "queue": queue,
            "params": BY_LETTER["G"].params,
        }
        run_id = web.post("/v1/runs", json=body).json()["run_id"]
        wait_until(lambda: receiver.bodies("run.needs_approval") != [], what="needs_approval")
        held = receiver.bodies("run.needs_approval")[0]
        approved = web.post(f"/v1/runs/{run_id}/approve", json={"digest": held["event"]["digest"]})
        assert approved.status_code == 200, approved.text
        wait_until(lambda: receiver.bodies("run.finished") != [], what="finished")
        listed = web.get("/v1/webhooks").json()["webhooks"]
        removed = web.delete(f"/v1/webhooks/{made.json()['id']}")
        removed_again = web.delete(f"/v1/webhooks/{made.json()['id']}")
        left = web.get("/v1/webhooks").json()["webhooks"]
    assert (removed.status_code, removed_again.status_code, left) == (204, 404, [])
    assert not client.client.sismember(http_keys.WEBHOOK_TENANTS, tenant)
    assert _signed(receiver, secret)
    assert held["run_id"] == run_id and held["tenant"] == tenant
    assert held["event"]["tool"] == "issue_refund"
    finished = receiver.bodies("run.finished")
    assert [(f["run_id"], f["event"]["outcome"]) for f in finished] == [(run_id, "completed")]
    assert {b["tenant"] for b in receiver.bodies()} == {tenant}
    headers = receiver.got[-1][0]
    assert headers["turnstile-event"] == "run.finished" and headers["turnstile-delivery"]
    assert secret not in json.dumps(listed)
    assert listed[0]["last_delivery"]["status_code"] == 200


def test_a_failing_receiver_gets_the_delivery_on_retry(
    redis_url: str, api: ApiServer, client: Client, queue: str, unique: str
) -> None:
    """An endpoint that answers 500 twice and then comes back gets the same delivery (same id,
    same body) on the third try, and its last status says so."""
    tenant = f"t-{unique}"
    with (
        receiving(Receiver(fail_first=2)) as receiver,
        http(api, make_key(redis_url, tenant)) as web,
    ):
        web.post("/v1/webhooks", json={"url": receiver.url, "events": ["run.finished"]})
        web.post("/v1/runs", json={"user": USER, "goal": GOAL, "job": "support", "queue": queue})
        wait_until(lambda: len(receiver.got) >= 3, what="three tries")
        wait_until(
            lambda: (
                web.get("/v1/webhooks").json()["webhooks"][0]["last_delivery"]["result"]
                == "delivered"
            ),
            what="recorded as delivered",
        )
        last = web.get("/v1/webhooks").json()["webhooks"][0]["last_delivery"]
    assert len({h["turnstile-delivery"] for h, _ in receiver.got}) == 1
    assert len({body for _, body in receiver.got}) == 1
    assert (last["attempts"], last["status_code"], len(receiver.got)) == (3, 200, 3)
    assert "webhook_attempt_failed" not in api.log()


def test_an_endpoint_that_never_answers_delays_nothing(
    redis_url: str, api: ApiServer, client: Client, queue: str, unique: str
) -> None:
    """With one endpoint that never answers and one that does, every run finishes and the good
    endpoint gets each `run.finished` while the silent one still has not answered."""
    tenant = f"t-{unique}"
    with (
        receiving(Receiver(hang=True)) as silent,
        receiving(Receiver()) as good,
        http(api, make_key(redis_url, tenant)) as web,
    ):
        for receiver in (silent, good):
            web.post("/v1/webhooks", json={"url": receiver.url, "events": ["run.finished"]})
        body = {"user": USER, "goal": GOAL, "job": "support", "queue": queue}
        ids = [web.post("/v1/runs", json=body).json()["run_id"] for _ in range(4)]
        wait_until(lambda: len(good.bodies("run.finished")) == 4, what="all four delivered")
        assert not silent.released.is_set() and len(silent.got) >= 1
    assert {b["run_id"] for b in good.bodies()} == set(ids)
    assert all(client.store.hash(tenant, r)["outcome"] == "completed" for r in ids)
