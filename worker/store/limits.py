"""Providers' rate limits as the store keeps them: each limited model endpoint's buckets (its
own and a tenant's share, keys.rate_bucket, in the endpoint's slot), the tenants with a share,
the steps that drew already and wait (keys.rate_paid), the endpoints with a limit; and each
tenant's deferred steps (keys.deferred) with the set of tenants that have some. The rules
(what a limit may be, how a bucket refills, when a turn waits) are
worker/scheduling/ratelimits.py's and rl_lib.lua's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import redis

from turnstile.worker.store import keys
from turnstile.worker.store.run_calls import sent_member
from turnstile.worker.store.scripts import ScriptCall
from turnstile.worker.store.values import writing

RPM, TPM = "rpm", "tpm"  # a bucket's limits; its levels are "r" and "t"
LEVELS = {RPM: "r", TPM: "t"}
BUCKET_FIELDS = (RPM, TPM, "r", "t", "at", "blocked", "burst_s")  # `bucket`'s, in its order


# -- the operators' side --------------------------------------------------------------------


def has_limit(client: redis.Redis, endpoint: str, tenant: str = "") -> bool:
    """Whether the endpoint's bucket (or the tenant's share of it) has a limit set."""
    return client.hmget(keys.rate_bucket(endpoint, tenant), RPM, TPM) != [None, None]


def write(client: redis.Redis, endpoint: str, limits: Mapping[str, int], tenant: str = "") -> None:
    """Set limits (and a burst) on the endpoint's bucket, or the tenant's share of it, and
    list the endpoint (and the tenant) as limited, at once."""
    pipe = client.pipeline(transaction=True)
    pipe.hset(keys.rate_bucket(endpoint, tenant), mapping=dict(limits.items()))
    if tenant:
        pipe.sadd(keys.rate_tenants(endpoint), tenant)
    pipe.sadd(keys.RATE_ENDPOINTS, endpoint)
    pipe.execute()


def remove(client: redis.Redis, endpoint: str, names: list[str], tenant: str = "") -> list[str]:
    """Remove the limits `names` (and their levels) from the bucket; a bucket left without
    limits goes, with the tenant's place and, when nothing of it is limited any more, the
    endpoint's. The limits that were set."""
    key = keys.rate_bucket(endpoint, tenant)
    had = client.hmget(key, *names)
    pipe = client.pipeline(transaction=True)
    pipe.hdel(key, *names, *(LEVELS[n] for n in names))
    pipe.execute()
    if client.hget(key, RPM) is None and client.hget(key, TPM) is None:
        client.delete(key)
        if tenant:
            client.srem(keys.rate_tenants(endpoint), tenant)
    if not has_limit(client, endpoint) and not client.scard(keys.rate_tenants(endpoint)):
        client.srem(keys.RATE_ENDPOINTS, endpoint)
    return [n for n, v in zip(names, had, strict=True) if v is not None]


def endpoints(client: redis.Redis) -> list[str]:
    """The endpoints with a limit, by name."""
    return sorted(str(e) for e in client.smembers(keys.RATE_ENDPOINTS))


def tenants(client: redis.Redis, endpoint: str) -> list[str]:
    """The tenants with a share of their own of the endpoint, by name."""
    return sorted(str(t) for t in client.smembers(keys.rate_tenants(endpoint)))


def paid_waiting(client: redis.Redis, endpoint: str, now_ms: int) -> int:
    """Deferred steps that drew from the endpoint's buckets and wait for their turn still."""
    return int(client.zcount(keys.rate_paid(endpoint), now_ms, "+inf"))


def bucket(client: redis.Redis, endpoint: str, tenant: str = "") -> list[Any]:
    """The bucket's fields as stored, in BUCKET_FIELDS' order (None for one not set)."""
    return list(client.hmget(keys.rate_bucket(endpoint, tenant), *BUCKET_FIELDS))


# -- a worker's side: the draw and its adjustments -------------------------------------------


def limited(client: redis.Redis) -> frozenset[str]:
    """The endpoints with a limit (a worker caches them)."""
    return frozenset(str(e) for e in client.smembers(keys.RATE_ENDPOINTS))


def draw_call(
    endpoint: str, tenant: str, run_id: str, version: int, *, tokens: int, longest_ms: int
) -> ScriptCall:
    """rl_draw.lua: one request and `tokens` for the turn of step `version` (its next step
    recorded as paid if it waits)."""
    return ScriptCall(
        [keys.rate_bucket(endpoint), keys.rate_bucket(endpoint, tenant), keys.rate_paid(endpoint)],
        [sent_member(tenant, run_id, version), max(0, tokens), max(0, longest_ms),
         sent_member(tenant, run_id, version + 1)],
    )  # fmt: skip


def refund_call(endpoint: str, tenant: str, tokens: int) -> ScriptCall:
    """rl_adjust.lua: tokens a turn drew and did not use given back (negative: it used more)."""
    return ScriptCall(
        [keys.rate_bucket(endpoint), keys.rate_bucket(endpoint, tenant)], ["refund", tokens]
    )


def block_call(endpoint: str, wait_ms: int) -> ScriptCall:
    """rl_adjust.lua: the endpoint's bucket emptied until `wait_ms` from now (a 429)."""
    return ScriptCall([keys.rate_bucket(endpoint), keys.rate_bucket(endpoint)], ["block", wait_ms])


# -- deferred steps ---------------------------------------------------------------------------


def defer(
    client: redis.Redis, tenant: str, entry: str, due_ms: int, *, pipe: Any | None = None
) -> None:
    """Keep the step's pending entry in the tenant's deferred set until `due_ms`, the tenant
    in the set of tenants with deferred steps after it."""
    with writing(client, pipe) as out:
        out.zadd(keys.deferred(tenant), {entry: due_ms})
        out.sadd(keys.DEFERRED_TENANTS, tenant)


def deferring(client: redis.Redis) -> list[str]:
    """The tenants that may have deferred steps, by name."""
    return sorted(str(t) for t in client.smembers(keys.DEFERRED_TENANTS))


def due_call(tenant: str, most: int) -> ScriptCall:
    """fair_due.lua: at most `most` of the tenant's deferred steps whose wait is over."""
    return ScriptCall([keys.deferred(tenant)], [most])


def drop_deferring(client: redis.Redis, tenant: str) -> None:
    """A tenant with nothing deferred leaves the set; a step deferred meanwhile re-adds it
    (its deferral adds the tenant after its entry, and we look after the removal)."""
    client.srem(keys.DEFERRED_TENANTS, tenant)
    if client.zcard(keys.deferred(tenant)):
        client.sadd(keys.DEFERRED_TENANTS, tenant)
