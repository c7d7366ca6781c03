"""The leases that make one process at a time do a thing: one dispatcher, one sweep and one
retention pass an interval, one webhook deliverer. Each is a key with a time to live."""

from __future__ import annotations

import redis

from turnstile.worker.store import http_keys, keys

DISPATCHER = keys.FAIR_LOCK
SWEEPER = keys.SWEEP_LOCK
RETENTION = keys.RETENTION_LOCK
DELIVERER = http_keys.DELIVERY_LOCK


def lead(client: redis.Redis, lock: str, token: str, ttl_ms: int) -> bool:
    """Take the lease for `token`, or renew it when `token` holds it; whether it holds it."""
    if client.set(lock, token, nx=True, px=ttl_ms):
        return True
    if client.get(lock) == token:
        return bool(client.pexpire(lock, ttl_ms))
    return False


def resign(client: redis.Redis, lock: str, token: str) -> None:
    """Give the lease up, if `token` holds it."""
    if client.get(lock) == token:
        client.delete(lock)


def once_per(client: redis.Redis, lock: str, interval_ms: int) -> bool:
    """Whether this caller is the first to ask in the last `interval_ms`."""
    return bool(client.set(lock, "1", nx=True, px=interval_ms))
