"""Small reads of a run the client and the step make between the run store's scripts: the
tenant a run id belongs to, a run's status, the marks a cancel request or an interrupt left on
it, and its event stream read as it grows. Each is one command; the caller handles a store
that cannot be reached (the client's edge, a step's retry)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec
import redis

from turnstile.worker.store import fields, keys
from turnstile.worker.store.values import text

NO_EVENT = "0-0"  # a stream id before every entry: read from the first


def tenant_of(client: redis.Redis, run_id: str) -> str:
    """The tenant that holds the run id; "" when no one does."""
    return text(client.hget(keys.RUN_TENANTS, run_id))


def status(client: redis.Redis, tenant: str, run_id: str) -> str:
    """The run's status as stored; "" for no such run."""
    return text(client.hget(keys.run(tenant, run_id), fields.STATUS))


@dataclass(frozen=True)
class CancelMarks:
    """What a cancel request (`Client.cancel` on a running run) or an interrupt (a newer run of
    the run's conversation) left on the run for its step to honour; "" for each that is not."""

    by: str  # who asked for the cancel
    reason: str
    version: str  # the run's version when read
    by_run: str  # the run that interrupts it


def cancel_marks(client: redis.Redis, tenant: str, run_id: str) -> CancelMarks:
    by, reason, version, by_run = client.hmget(
        keys.run(tenant, run_id),
        fields.CANCEL_BY,
        fields.CANCEL_REASON,
        fields.VERSION,
        fields.SUPERSEDE_BY,
    )
    return CancelMarks(text(by), text(reason), text(version), text(by_run))


def newest_event(client: redis.Redis, tenant: str, run_id: str) -> str:
    """The id of the run's newest event, or NO_EVENT: a read after it returns what comes next."""
    newest: Any = client.xrevrange(keys.events(tenant, run_id), count=1)
    return text(newest[0][0]) if newest else NO_EVENT


def read_events(
    client: redis.Redis, tenant: str, run_id: str, after: str, *, count: int,
    block_ms: int | None,
) -> list[tuple[str, dict[str, Any]]]:  # fmt: skip
    """Up to `count` of the run's events after the id `after`, in stored order, as (id,
    event); waits up to `block_ms` for one when there is none yet (None: does not wait)."""
    reply: Any = client.xread({keys.events(tenant, run_id): after}, count=count, block=block_ms)
    entries = reply[0][1] if reply else []
    return [(text(eid), msgspec.json.decode(text(fields["event"]))) for eid, fields in entries]
