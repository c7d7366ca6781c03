"""The queues as the store keeps them: the ones the workers serve, which of them a tenant may
submit to, and the ones found broken.

- Served: each worker registers the queues it reads as it starts (`register_served`, a hash
  of queue -> when a worker last started on it, kept: a queue whose workers are scaled to zero
  for the night is still served, and its backlog is what scales them up again).
- Who may submit where (`refusal`, pure): a tenant with a list of its own (`turnstile tenants
  set T queues=a,b`, the `queues` field of its caps hash) may submit to those queues only;
  any other tenant to the queues TURNSTILE_SUBMIT_QUEUES lists, or, when it lists none, to the
  served queues and the default queue. `*` there lets any queue name through.
- Broken: a queue whose keys the dispatcher cannot use (a key of the wrong type where its
  broker list or a tenant's pending set is, WRONGTYPE) is skipped by it and recorded here
  with the error (`mark_broken`), until a pass over it works again (`mark_mended`); the
  operator's queue views show it.
"""

from __future__ import annotations

from collections.abc import Iterable

import redis

from turnstile.worker.names import ANY_QUEUE, check_name, split_names
from turnstile.worker.store import keys
from turnstile.worker.store.values import text

TENANT_QUEUES = "queues"  # the field of the tenant's caps hash that lists its queues
NO_LIST = ("none", "")  # `queues=none`: the tenant has no list of its own
MAX_ERROR_CHARS = 200


def register_served(client: redis.Redis, queues: Iterable[str], now_ms: int) -> None:
    """Record that a worker serves these queues (and list them among the store's queues)."""
    names = sorted(set(queues))
    if not names:
        return
    pipe = client.pipeline(transaction=False)
    pipe.hset(keys.SERVED_QUEUES, mapping=dict.fromkeys(names, now_ms))
    pipe.sadd(keys.QUEUES, *names)
    pipe.execute()


def names(client: redis.Redis) -> list[str]:
    """Every queue the store holds: used, controlled or served."""
    return sorted(text(q) for q in client.smembers(keys.QUEUES))


def known(client: redis.Redis, queue: str) -> bool:
    return bool(client.sismember(keys.QUEUES, queue))


def served(client: redis.Redis) -> dict[str, int]:
    """Every queue a worker has served, with when one last started on it (ms)."""
    return {text(q): int(text(ms) or 0) for q, ms in client.hgetall(keys.SERVED_QUEUES).items()}


def parse_tenant_queues(raw: str) -> list[str]:
    """`a,b` as a tenant's list of queues (each checked by the name rule); `none`: no list.
    The value of `turnstile tenants set T queues=...`, checked before anything is written."""
    if raw.strip() in NO_LIST:
        return []
    return sorted({check_name("queue", name) for name in split_names(raw)})


def tenant_queues(stored: object) -> frozenset[str] | None:
    """A tenant's list of queues as its caps hash keeps it ("a,b"); None when it has none."""
    names = split_names(text(stored)) if stored else []
    return frozenset(names) or None


def refusal(
    queue: str,
    *,
    tenant: str,
    tenant_list: frozenset[str] | None,
    listed: frozenset[str] | None,
    is_served: bool,
    default_queue: str,
) -> str | None:
    """Why `tenant` may not submit to `queue`, in one line, or None: its own list when it
    has one (`tenant_list`), else TURNSTILE_SUBMIT_QUEUES (`listed`, `*` for any), else the
    queues the workers serve (`is_served`) and the default queue."""
    if tenant_list is not None:
        if queue in tenant_list:
            return None
        return f"queue {queue!r} is not open to tenant {tenant!r}"
    if listed is not None:
        if ANY_QUEUE in listed or queue in listed:
            return None
        return f"queue {queue!r} is not one of the queues TURNSTILE_SUBMIT_QUEUES lists"
    if is_served or queue == default_queue:
        return None
    return (
        f"no worker serves queue {queue!r}: start one with `turnstile worker --queues "
        f"{queue}`, or list the queue in TURNSTILE_SUBMIT_QUEUES"
    )


def mark_broken(client: redis.Redis, queue: str, error: str, now_ms: int) -> None:
    client.hset(keys.BROKEN_QUEUES, queue, f"{now_ms}|{error[:MAX_ERROR_CHARS]}")


def mark_mended(client: redis.Redis, queue: str) -> None:
    client.hdel(keys.BROKEN_QUEUES, queue)


def broken(client: redis.Redis) -> dict[str, str]:
    """The queues the dispatcher found broken, with the error it met on each."""
    raw = client.hgetall(keys.BROKEN_QUEUES)
    return {text(q): text(v).partition("|")[2] for q, v in raw.items()}
