"""A run's events followed as they are appended, on an asyncio client: the HTTP API's event
streams wait on the loop, not on a thread. Each entry of a run's stream (keys.events) holds
one event, JSON, in its field `event`; the commit that appends it writes the run's status in
the same script."""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis

from turnstile.worker.store import fields, keys

EVENT = "event"  # a stream entry's one field


async def after(
    r: aioredis.Redis, tenant: str, run_id: str, last: str, *, count: int,
    block_ms: int | None = None,
) -> list[tuple[str, str]]:  # fmt: skip
    """Up to `count` entries after `last` (exclusive) as (entry id, event JSON); with
    `block_ms`, waiting that long for one when there is none yet."""
    reply: Any = await r.xread({keys.events(tenant, run_id): last}, count=count, block=block_ms)
    entries = reply[0][1] if reply else []
    return [(str(entry_id), str(entry.get(EVENT, "{}"))) for entry_id, entry in entries]


async def status(r: aioredis.Redis, tenant: str, run_id: str) -> str | None:
    """The run's status, None when there is no run."""
    found = await r.hget(keys.run(tenant, run_id), fields.STATUS)
    return None if found is None else str(found)
