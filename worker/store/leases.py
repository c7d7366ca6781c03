"""A run's leases: when its next step must have started or its turn committed (keys.leases,
set by the scripts that create, load and commit a run; the sweeper sends a step again when
one lapses), and the turns in flight now (keys.inflight: "<queue>|<pid>|<host>|<delivery
token>|<lease ms>" per run, which a drain waits on)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import redis

from turnstile.worker.store import keys
from turnstile.worker.store.values import text


def lapsed(client: redis.Redis, tenant: str, now_ms: int, most: int) -> list[str]:
    """At most `most` of the tenant's runs whose lease lapsed by `now_ms`, soonest first."""
    return [str(r) for r in client.zrangebyscore(keys.leases(tenant), 0, now_ms, start=0,
                                                 num=most)]  # fmt: skip


def drop(client: redis.Redis, tenant: str, run_id: str) -> None:
    """Forget the run's lease (a lease of a run that is not live)."""
    client.zrem(keys.leases(tenant), run_id)


def push_back(client: redis.Redis, tenant: str, run_id: str, until_ms: int) -> None:
    """Move the run's lease to `until_ms`, if it still has one."""
    client.zadd(keys.leases(tenant), {run_id: until_ms}, xx=True)


@dataclass(frozen=True)
class InFlight:
    """A turn in flight, as its entry says."""

    tenant: str
    run_id: str
    queue: str
    lease_ms: int | None  # when its in-flight lease lapses (None: an entry that does not say)


def in_flight(client: redis.Redis, tenants: Sequence[str]) -> list[InFlight]:
    """The turns in flight of `tenants`, lapsed ones included, in one round trip; by tenant
    as given, then by run id."""
    pipe = client.pipeline(transaction=False)
    for tenant in tenants:
        pipe.hgetall(keys.inflight(tenant))
    out = []
    for tenant, raw in zip(tenants, pipe.execute(), strict=True):
        entries = {text(k): text(v) for k, v in raw.items()}
        for run_id in sorted(entries):
            parts = entries[run_id].split("|")
            lease = parts[-1]
            out.append(InFlight(tenant, run_id, parts[0], int(lease) if lease.isdigit() else None))
    return out
