"""The operators' flags: a tenant's `control` hash and a queue's (keys.control,
keys.queue_control) hold `paused` (and, for a queue, `draining`) as the ISO time the flag was
set, `<flag>_by` as who set it, and `resumed_at` / `resumed_by` for the last resume. Every step
reads them at its gate (run_load.lua, and the queue's in the same round trip), so what is
written here is honoured at the next turn boundary by every worker.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import redis

from turnstile.worker.store import keys
from turnstile.worker.store.values import text, writing

Target = Literal["queue", "tenant"]
PAUSED, DRAINING = "paused", "draining"
RESUMED_AT, RESUMED_BY = "resumed_at", "resumed_by"


def _by(flag: str) -> str:
    return f"{flag}_by"


def _key(target: Target, name: str) -> str:
    return keys.queue_control(name) if target == "queue" else keys.control(name)


def set_flag(
    client: redis.Redis, target: Target, name: str, flag: str, *, by: str, at: str
) -> tuple[bool, str, str]:
    """Set `flag` on the queue or tenant unless it is set: (whether this set it, when it was
    set, by whom)."""
    key = _key(target, name)
    if client.hsetnx(key, flag, at):
        client.hset(key, _by(flag), by)
        return True, at, by
    was_at, was_by = (text(v) for v in client.hmget(key, flag, _by(flag)))
    return False, was_at, was_by


def clear_flags(client: redis.Redis, target: Target, name: str, flags: Sequence[str]) -> list[str]:
    """Clear `flags` (and who set them) at once; the ones that were set."""
    key = _key(target, name)
    pipe = client.pipeline(transaction=True)
    pipe.hmget(key, *flags)
    pipe.hdel(key, *flags, *(_by(f) for f in flags))
    values, _ = pipe.execute()
    return [f for f, v in zip(flags, values, strict=True) if v]


def mark_resumed(
    client: redis.Redis, target: Target, name: str, *, by: str, at: str, pipe: Any | None = None
) -> None:
    with writing(client, pipe) as out:
        out.hset(_key(target, name), mapping={RESUMED_AT: at, RESUMED_BY: by})


def tenant_paused(client: redis.Redis, tenant: str) -> bool:
    return bool(client.hget(keys.control(tenant), PAUSED))


def queue_open(client: redis.Redis, queue: str) -> bool:
    """Neither paused nor draining."""
    paused, draining = client.hmget(keys.queue_control(queue), PAUSED, DRAINING)
    return not paused and not draining


def queue_draining(client: redis.Redis, queue: str) -> bool:
    return bool(client.hget(keys.queue_control(queue), DRAINING))


def queue_flags(client: redis.Redis, queue: str) -> tuple[str, str, str, str]:
    """(paused, paused_by, draining, draining_by), "" for a flag not set."""
    paused, paused_by, draining, draining_by = (
        text(v) for v in client.hmget(keys.queue_control(queue), PAUSED, _by(PAUSED), DRAINING,
                                      _by(DRAINING))
    )  # fmt: skip
    return paused, paused_by, draining, draining_by


def tenant_flags(client: redis.Redis, tenant: str) -> tuple[str, str, str, str]:
    """(paused, paused_by, resumed_at, resumed_by), "" for what is not set."""
    paused, paused_by, resumed_at, resumed_by = (
        text(v) for v in client.hmget(keys.control(tenant), PAUSED, _by(PAUSED), RESUMED_AT,
                                      RESUMED_BY)
    )  # fmt: skip
    return paused, paused_by, resumed_at, resumed_by
