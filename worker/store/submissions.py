"""What a submission reads and writes around the run store's create (or join): in one round
trip, what its refusals need; the run id claimed for its tenant (run ids are global: the index
`keys.RUN_TENANTS` finds a run by its id alone), or let go again when no run of it was made;
and the run as `RunStore.create` and `RunStore.join` take it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis

from turnstile.worker.store import fields, keys
from turnstile.worker.store import queues as served_queues
from turnstile.worker.store.values import text


@dataclass(frozen=True)
class Found:
    """What a submission finds before it writes anything."""

    draining: bool  # the queue takes no new runs
    owner: str | None  # the tenant that holds the run id; None: no one yet
    fingerprint: str | None  # the submission stored for the tenant's run of that id, if any
    extendable: str  # the budget dimensions the tenant made extendable, as stored ("a,b")
    tenant_queues: frozenset[str] | None  # the queues the tenant may submit to, if it has a list
    served: bool  # whether a worker serves the queue


def before_writing(client: redis.Redis, queue: str, tenant: str, run_id: str) -> Found:
    """What the refusals of a submission of `run_id` by `tenant` to `queue` need, in one round
    trip."""
    pipe = client.pipeline(transaction=False)
    pipe.hget(keys.queue_control(queue), "draining")
    pipe.hget(keys.RUN_TENANTS, run_id)
    pipe.hget(keys.run(tenant, run_id), fields.FINGERPRINT)
    pipe.hmget(keys.caps(tenant), "extendable", served_queues.TENANT_QUEUES)
    pipe.hexists(keys.SERVED_QUEUES, queue)
    draining, owner, stored, (extendable, own_queues), is_served = pipe.execute()
    return Found(
        draining=bool(draining),
        owner=None if owner is None else text(owner),
        fingerprint=None if stored is None else text(stored),
        extendable=text(extendable),
        tenant_queues=served_queues.tenant_queues(own_queues),
        served=bool(is_served),
    )


def claim_run_id(client: redis.Redis, run_id: str, tenant: str) -> str:
    """Claim the run id for the tenant unless another holds it; the tenant that holds it now."""
    pipe = client.pipeline(transaction=False)
    pipe.hsetnx(keys.RUN_TENANTS, run_id, tenant)
    pipe.hget(keys.RUN_TENANTS, run_id)
    return text(pipe.execute()[1])


def release_run_id(client: redis.Redis, run_id: str) -> None:
    """Let the run id go: no run of it was made."""
    client.hdel(keys.RUN_TENANTS, run_id)


@dataclass(frozen=True)
class NewRun:
    """A run as a submission stores it (`RunStore.create`, or `RunStore.join` for a run of a
    conversation): its state, the submission's fingerprint, its first event and the ledger
    hold of its first turn."""

    tenant: str
    run_id: str
    state_json: str
    fingerprint: str
    queue: str
    job: str
    user_id: str
    pickup_lease_ms: int
    event: dict[str, Any]
    hold: str
    priority: int

    def fields(self) -> dict[str, Any]:
        """As `RunStore.create` and `RunStore.join` take it, by keyword."""
        return {name: getattr(self, name) for name in self.__dataclass_fields__}
