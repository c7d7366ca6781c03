"""The tenants as the store keeps them: the set of every tenant with runs (the sweeper's and
the operators' starting point) and each tenant's settings hash (`keys.caps`: its caps on turns
in flight and active runs, its weight, the budget dimensions it made extendable, the queues it
may submit to). The dispatcher and the scripts read the settings; operators write them.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import redis

from turnstile.worker.store import keys
from turnstile.worker.store.values import text

SCAN_COUNT = 500  # members asked for per SSCAN call: the tenants are read in slices
WEIGHT = "weight"  # a tenant's share of the dispatcher's round robin, 1 by default


def scan(client: redis.Redis, count: int = SCAN_COUNT) -> Iterator[str]:
    """Every tenant with runs, as SSCAN gives them (a tenant present throughout is seen, maybe
    twice)."""
    for raw in client.sscan_iter(keys.TENANTS, count=count):
        yield text(raw)


def names(client: redis.Redis) -> list[str]:
    """Every tenant with runs, by name, read in slices."""
    return sorted(set(scan(client)))


def known(client: redis.Redis, tenant: str) -> bool:
    return bool(client.sismember(keys.TENANTS, tenant))


def set_settings(
    client: redis.Redis, tenant: str, settings: Mapping[str, int | str | None]
) -> None:
    """Write some of a tenant's settings at once (None removes one); a tenant not seen yet is
    allowed: they apply from its first submission."""
    if not settings:
        return
    pipe = client.pipeline(transaction=True)  # the tenant's settings: one key, one slot
    for name, value in settings.items():
        if value is None:
            pipe.hdel(keys.caps(tenant), name)
        else:
            pipe.hset(keys.caps(tenant), name, value)
    pipe.execute()


def weights(client: redis.Redis, tenants: Sequence[str]) -> dict[str, int]:
    """Each tenant's weight (1 when none is set), in one round trip."""
    pipe = client.pipeline(transaction=False)
    for name in tenants:
        pipe.hget(keys.caps(name), WEIGHT)
    return {t: int(w or 1) for t, w in zip(tenants, pipe.execute(), strict=True)}
