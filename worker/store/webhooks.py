"""Webhook endpoints as the store keeps them, and where the deliverer stands in each tenant's
runs.

An endpoint's record (`Endpoint`, with its secret) is in the API's hash of endpoints, its id
in its tenant's set (webhook_add.lua counts it against the cap), its last delivery's status
beside it. The deliverer learns of events by reading what every commit writes: the tenant's
runs index from its cursor (the creation time of the newest run it took), each watched run's
event stream from the last entry it read, and the runs it finished with near the cursor (so a
run created in the cursor's own millisecond is not taken twice). Each endpoint's pending
deliveries are outbox.py's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec
import redis

from turnstile.worker.store import http_keys, keys
from turnstile.worker.store.follow import EVENT
from turnstile.worker.store.scripts import ScriptCall, register
from turnstile.worker.store.values import server_ms, text, writing

UNREAD = "-"  # a watched run none of whose events the deliverer has read
WEBHOOKS = http_keys.WEBHOOKS  # hash: endpoint id -> its record


class Endpoint(msgspec.Struct, frozen=True):
    id: str
    tenant: str
    url: str
    events: list[str]
    secret: str
    created_at: str
    description: str = ""

    def public(self, status: dict[str, Any] | None = None) -> dict[str, Any]:
        return {"id": self.id, "url": self.url, "events": self.events,
                "description": self.description, "created_at": self.created_at,
                "last_delivery": status}  # fmt: skip


def endpoint_tenant(record: Any) -> str | None:
    """The tenant of a stored endpoint record; None when it is gone or unreadable."""
    if record is None:
        return None
    try:
        return msgspec.json.decode(record, type=Endpoint).tenant
    except msgspec.DecodeError:
        return None


# -- registering, listing, removing ----------------------------------------------------------


def add_call(tenant: str, endpoint_id: str, most: int, now_ms: int) -> ScriptCall:
    """webhook_add.lua: the endpoint's id into its tenant's set, unless the tenant has `most`."""
    return ScriptCall([http_keys.tenant_webhooks(tenant), http_keys.cursor(tenant)],
                      [endpoint_id, most, now_ms])  # fmt: skip


def add(client: redis.Redis, endpoint: Endpoint, most: int) -> bool:
    """Register the endpoint, unless its tenant has `most` already (nothing is left then)."""
    # The record first: until the script adds its id to the tenant's set it is neither listed
    # nor delivered to, and an id in the set always has its record.
    client.hset(http_keys.WEBHOOKS, endpoint.id, msgspec.json.encode(endpoint))
    call = add_call(endpoint.tenant, endpoint.id, most, server_ms(client))
    added, _ = register(client, "webhook_add")(keys=call.keys, args=call.args)
    if not int(added):
        client.hdel(http_keys.WEBHOOKS, endpoint.id)
        return False
    client.sadd(http_keys.WEBHOOK_TENANTS, endpoint.tenant)
    return True


def endpoints(client: redis.Redis, tenant: str) -> list[Endpoint]:
    """The tenant's endpoints, by id."""
    ids = sorted(str(i) for i in client.smembers(http_keys.tenant_webhooks(tenant)))
    raw = client.hmget(http_keys.WEBHOOKS, ids) if ids else []
    return [msgspec.json.decode(x, type=Endpoint) for x in raw if x]


def endpoint(client: redis.Redis, endpoint_id: str) -> Any:
    """The endpoint's record as stored (decode it with `Endpoint`), None when it is gone."""
    return client.hget(http_keys.WEBHOOKS, endpoint_id)


def statuses(client: redis.Redis, endpoint_ids: Sequence[str]) -> list[dict[str, Any] | None]:
    """Each endpoint's last delivery, None for one never tried."""
    raw = client.hmget(http_keys.WEBHOOK_STATUS, list(endpoint_ids)) if endpoint_ids else []
    return [msgspec.json.decode(s) if s else None for s in raw]


def record_status(
    client: redis.Redis, endpoint_id: str, status: dict[str, Any], *, pipe: Any | None = None
) -> None:
    """The endpoint's last delivery, as the listing shows it."""
    with writing(client, pipe) as out:
        out.hset(http_keys.WEBHOOK_STATUS, endpoint_id, msgspec.json.encode(status))


def remove(client: redis.Redis, tenant: str, endpoint_id: str) -> bool:
    """Remove the tenant's endpoint and drop its pending deliveries; False when the tenant has
    no such endpoint. A tenant left with none is forgotten by the deliverer, so a later
    endpoint starts from its own registration instead of announcing every run in between."""
    if not client.srem(http_keys.tenant_webhooks(tenant), endpoint_id):
        return False
    pipe = client.pipeline(transaction=False)
    pipe.hdel(http_keys.WEBHOOKS, endpoint_id)
    pipe.hdel(http_keys.WEBHOOK_STATUS, endpoint_id)
    for gone in http_keys.endpoint_queue(tenant, endpoint_id):
        pipe.delete(gone)
    pipe.execute()
    if not client.scard(http_keys.tenant_webhooks(tenant)):
        pipe = client.pipeline(transaction=False)
        pipe.srem(http_keys.WEBHOOK_TENANTS, tenant)
        for gone in (http_keys.cursor(tenant), http_keys.watch(tenant), http_keys.done(tenant)):
            pipe.delete(gone)  # one key a DEL: a cluster's pipeline takes no more
        pipe.execute()
    return True


def tenants(client: redis.Redis) -> list[str]:
    """The tenants with at least one endpoint, by name."""
    return sorted(str(t) for t in client.smembers(http_keys.WEBHOOK_TENANTS))


def endpoint_ids(client: redis.Redis, tenant_names: Sequence[str]) -> list[list[str]]:
    """Each tenant's endpoint ids (unordered), in one round trip."""
    pipe = client.pipeline(transaction=False)
    for tenant in tenant_names:
        pipe.smembers(http_keys.tenant_webhooks(tenant))
    return [[str(i) for i in ids] for ids in pipe.execute()]


# -- the deliverer's place in the tenant's runs --------------------------------------------


def watch_new_runs(client: redis.Redis, tenant: str, most: int) -> None:
    """Take up to `most` runs created since the cursor into the watch (none the deliverer
    finished with), and move the cursor to the newest of them."""
    cursor = int(client.get(http_keys.cursor(tenant)) or server_ms(client))
    new: list[Any] = client.zrangebyscore(
        keys.runs(tenant), cursor, "+inf", start=0, num=most, withscores=True
    )
    if not new:
        return
    pipe = client.pipeline(transaction=False)
    for run_id, _ in new:
        pipe.zscore(http_keys.done(tenant), run_id)
    finished_before = pipe.execute()
    top = max(int(score) for _, score in new)
    pipe = client.pipeline(transaction=False)
    for (run_id, _), done in zip(new, finished_before, strict=True):
        if done is None:
            pipe.hsetnx(http_keys.watch(tenant), run_id, UNREAD)
    pipe.set(http_keys.cursor(tenant), top)
    pipe.zremrangebyscore(http_keys.done(tenant), "-inf", f"({top}")
    pipe.execute()


def watched(client: redis.Redis, tenant: str) -> dict[str, str]:
    """The runs in the watch, with the last entry read of each (UNREAD: none yet)."""
    return {str(k): str(v) for k, v in client.hgetall(http_keys.watch(tenant)).items()}


def unread(
    client: redis.Redis, tenant: str, last: dict[str, str], most: int
) -> list[list[tuple[str, str]]]:
    """For each run of `last` in its order, up to `most` events after the last read, as
    (entry id, event JSON)."""
    pipe = client.pipeline(transaction=False)
    for run_id, after in last.items():
        start = "-" if after == UNREAD else f"({after}"
        pipe.xrange(keys.events(tenant, run_id), min=start, count=most)
    return [[(text(entry_id), str(entry.get(EVENT, "{}"))) for entry_id, entry in entries]
            for entries in pipe.execute()]  # fmt: skip


def created_ms(client: redis.Redis, tenant: str, run_id: str) -> int:
    """When the run was made (0 when it is gone)."""
    return int(client.zscore(keys.runs(tenant), run_id) or 0)


def read_to(pipe: Any, tenant: str, run_id: str, entry_id: str) -> None:
    """In `pipe`: the run's events are read up to `entry_id`."""
    pipe.hset(http_keys.watch(tenant), run_id, entry_id)


def finished(pipe: Any, tenant: str, run_id: str, created: int) -> None:
    """In `pipe`: the run leaves the watch, remembered as done by its creation time."""
    pipe.hdel(http_keys.watch(tenant), run_id)
    pipe.zadd(http_keys.done(tenant), {run_id: created})
