"""The webhook deliverer behind a load balancer, against real `turnstile api` processes and
real Celery workers: two servers deliver each event once, and a delivery that keeps failing
is given up after its retry time, recorded as such."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import msgspec
import pytest
import redis

from tests.integration.apiserver import http, make_key, running_api
from tests.integration.receivers import FAST, Receiver, receiving
from tests.integration.workers import WorkerProcess, client_for, running_workers, wait_until
from turnstile.jobs.support.scenarios import GOAL, USER
from turnstile.worker.store import http_keys
from turnstile.worker.store.outbox import Delivery
from turnstile.worker.store.values import server_ms

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def queue() -> str:
    return f"wd-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def pool(redis_url: str, queue: str) -> Iterator[list[WorkerProcess]]:
    with running_workers(redis_url, [queue], 2, prefix="wd") as workers:
        yield workers


def test_two_servers_deliver_each_event_once(
    redis_url: str, pool: list[WorkerProcess], queue: str, unique: str
) -> None:
    """Two API servers, both with webhooks on, behind one store: each run's `run.finished`
    reaches the endpoint once, whichever server took the submission."""
    tenant = f"t-{unique}"
    key = make_key(redis_url, tenant)
    body = {"user": USER, "goal": GOAL, "job": "support", "queue": queue}
    with (
        receiving(Receiver()) as receiver,
        running_api(redis_url, FAST) as one,
        running_api(redis_url, FAST) as two,
        http(one, key) as web_one,
        http(two, key) as web_two,
    ):
        made = web_one.post("/v1/webhooks", json={"url": receiver.url, "events": ["run.finished"]})
        ids = [web.post("/v1/runs", json=body).json()["run_id"] for web in (web_one, web_two) * 2]
        client = client_for(redis_url)
        wait_until(
            lambda: all(client.store.hash(tenant, r).get("status") == "stopped" for r in ids),
            what="runs finish",
        )
        wait_until(lambda: len(receiver.got) >= 4, what="four deliveries")
        # Every delivery to this endpoint is done (none pending to be sent a second time).
        wait_until(
            lambda: not pending(client.client, tenant, made.json()["id"]), what="none pending"
        )
    assert sorted(b["run_id"] for b in receiver.bodies()) == sorted(ids)
    assert len({h["turnstile-delivery"] for h, _ in receiver.got}) == len(receiver.got) == 4


def test_a_delivery_that_keeps_failing_is_given_up_after_its_retry_time(
    redis_url: str, pool: list[WorkerProcess], queue: str, unique: str
) -> None:
    """An endpoint that always answers 500 is retried with backoff until the retry time has
    passed, then the delivery is dropped and its last status says `gave_up`."""
    tenant = f"t-{unique}"
    env = {**FAST, "TURNSTILE_API_WEBHOOK_RETRY_FOR_S": "2"}
    with (
        receiving(Receiver(fail_first=10_000)) as receiver,
        running_api(redis_url, env) as api,
        http(api, make_key(redis_url, tenant)) as web,
    ):
        made = web.post("/v1/webhooks", json={"url": receiver.url, "events": ["run.finished"]})
        web.post("/v1/runs", json={"user": USER, "goal": GOAL, "job": "support", "queue": queue})

        def last() -> dict[str, object]:
            status = web.get("/v1/webhooks").json()["webhooks"][0]["last_delivery"]
            return status or {}

        wait_until(lambda: last().get("result") == "gave_up", what="given up", timeout_s=30)
        final = last()
        outbox = http_keys.outbox(tenant, made.json()["id"])
        outbox_left = client_for(redis_url).client.zscore(outbox, str(final["delivery"]))
        tries = len(receiver.got)
    # Backoff 0.3, 0.6, 1.2 s ... within 2 s: a handful of tries, the last one recorded.
    assert 3 <= tries <= 6 and final["attempts"] == tries and final["status_code"] == 500
    assert outbox_left is None


def pending(r: redis.Redis, tenant: str, endpoint_id: str) -> list[str]:
    """Ids of the deliveries to this endpoint still waiting in its outbox."""
    return [str(d) for d in r.zrange(http_keys.outbox(tenant, endpoint_id), 0, -1)]


def test_deliveries_an_older_server_left_in_the_shared_outbox_are_still_delivered(
    redis_url: str, unique: str
) -> None:
    """Deliveries in the one shared outbox older servers kept are moved into their endpoints'
    own outboxes and delivered (same id, same body); one whose endpoint is gone is dropped,
    and the shared outbox is left empty."""
    tenant = f"t-{unique}"
    r = client_for(redis_url).client
    with (
        receiving(Receiver()) as receiver,
        running_api(redis_url, FAST) as api,
        http(api, make_key(redis_url, tenant)) as web,
    ):
        made = web.post("/v1/webhooks", json={"url": receiver.url, "events": ["run.finished"]})
        now = server_ms(r)
        body = json.dumps({"type": "run.finished", "tenant": tenant, "run_id": "run_old"})
        kept = Delivery(f"dlv_{unique}", made.json()["id"], "run.finished", body, now)
        orphan = Delivery(f"dlv_gone_{unique}", "wh_0000000000000000", "run.finished", body, now)
        for delivery in (kept, orphan):
            r.hset(http_keys.LEGACY_DELIVERIES, delivery.id, msgspec.json.encode(delivery))
            r.zadd(http_keys.LEGACY_OUTBOX, {delivery.id: now})
        wait_until(lambda: receiver.got != [], what="the old delivery")
        wait_until(lambda: not r.exists(http_keys.LEGACY_OUTBOX), what="the shared outbox empty")
    [(headers, got)] = receiver.got
    assert headers["turnstile-delivery"] == kept.id and got.decode() == body
    assert not r.exists(http_keys.LEGACY_DELIVERIES)
