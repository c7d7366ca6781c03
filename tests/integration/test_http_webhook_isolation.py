"""Webhooks between tenants, against real `turnstile api` processes: the cap on a tenant's
endpoints holds under concurrent registrations."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import msgspec
import pytest

from tests.integration.apiserver import http, make_key, running_api
from tests.integration.workers import client_for
from turnstile.worker.http import keys as http_keys
from turnstile.worker.http.routes_webhooks import MAX_ENDPOINTS, Endpoint

pytestmark = pytest.mark.integration


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
