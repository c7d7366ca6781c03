"""How a queue lies on a Redis broker, as kombu's Redis transport lays it out: one list per
priority step, and Turnstile's dead letters beside them. The one place that knows it; the
dispatcher (its depth) and the operator's queue views (depth, dead letters) read it here.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import redis

from turnstile.worker.store import keys

# The Redis transport keeps a queue's messages in one list per priority step; step 0 is the
# bare queue name. kombu's defaults, which Turnstile's Celery app does not change.
PRIORITY_STEPS = (0, 3, 6, 9)
PRIORITY_SEP = "\x06\x16"
REDIS_SCHEMES = ("redis://", "rediss://", "unix://")


def priority_lists(queue: str) -> list[str]:
    """The broker lists that hold the queue's messages, one per priority step."""
    return [f"{queue}{PRIORITY_SEP}{pri}" if pri else queue for pri in PRIORITY_STEPS]


@contextmanager
def _redis_broker(broker_url: str) -> Iterator[redis.Redis | None]:
    """A short-lived connection to a Redis broker; None for another kind of broker."""
    if not broker_url.startswith(REDIS_SCHEMES):
        yield None
        return
    broker = redis.Redis.from_url(broker_url, socket_timeout=5)
    try:
        yield broker
    finally:
        broker.close()


def broker_depth(broker_url: str, queue: str) -> int | None:
    """Messages waiting in the queue on a Redis broker; None for another kind of broker."""
    with _redis_broker(broker_url) as broker:
        if broker is None:
            return None
        pipe = broker.pipeline(transaction=False)
        for name in priority_lists(queue):
            pipe.llen(name)
        return sum(int(n) for n in pipe.execute())


def dead_letter_count(broker_url: str, queue: str) -> int | None:
    """Dead letters of the queue on a Redis broker; None for another kind of broker."""
    with _redis_broker(broker_url) as broker:
        return None if broker is None else int(broker.llen(keys.dead_letters(queue)))
