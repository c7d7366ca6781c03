"""How a queue lies on the broker. On Redis, as kombu's Redis transport lays it out: one list
per priority step, and Turnstile's dead letters beside them. On RabbitMQ (amqp.py), a quorum
queue whose ready messages a passive `queue.declare` counts, and the dead letters in the
store. The one place that knows it; the dispatcher (its depth) and the operator's queue views
(depth, dead letters) read it here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import redis

from turnstile.worker.broker import amqp
from turnstile.worker.store import keys

# The Redis transport keeps a queue's messages in one list per priority step; step 0 is the
# bare queue name. kombu's defaults, which Turnstile's Celery app does not change.
PRIORITY_STEPS = (0, 3, 6, 9)
PRIORITY_SEP = "\x06\x16"
REDIS_SCHEMES = ("redis://", "rediss://", "unix://")

# A queue's depth: the messages waiting on the broker, by queue name.
Depth = Callable[[str], int]


def is_redis(broker_url: str) -> bool:
    return broker_url.startswith(REDIS_SCHEMES)


def priority_lists(queue: str) -> list[str]:
    """The broker lists that hold the queue's messages, one per priority step."""
    return [f"{queue}{PRIORITY_SEP}{pri}" if pri else queue for pri in PRIORITY_STEPS]


def redis_depth(broker: redis.Redis) -> Depth:
    """A queue's depth on a Redis broker: its priority lists' lengths, in one round trip."""

    def depth(queue: str) -> int:
        pipe = broker.pipeline(transaction=False)
        for name in priority_lists(queue):
            pipe.llen(name)
        return sum(int(n) for n in pipe.execute())

    return depth


def depth_reader(broker_url: str, connect: Callable[[str], redis.Redis]) -> Depth | None:
    """A long-lived reader of queue depths on this broker (the dispatcher's): over a client
    `connect` makes on Redis, over a kept channel on RabbitMQ; None for another broker."""
    if is_redis(broker_url):
        return redis_depth(connect(broker_url))
    if amqp.is_amqp(broker_url):
        return amqp.QueueDepth(broker_url)
    return None


@contextmanager
def _redis_broker(broker_url: str) -> Iterator[redis.Redis | None]:
    """A short-lived connection to a Redis broker; None for another kind of broker."""
    if not is_redis(broker_url):
        yield None
        return
    broker = redis.Redis.from_url(broker_url, socket_timeout=5)
    try:
        yield broker
    finally:
        broker.close()


def broker_depth(broker_url: str, queue: str) -> int | None:
    """Messages waiting in the queue on the broker; None for a broker of another kind."""
    if amqp.is_amqp(broker_url):
        with amqp.QueueDepth(broker_url) as depth:
            return depth(queue)
    with _redis_broker(broker_url) as broker:
        return None if broker is None else redis_depth(broker)(queue)


@contextmanager
def dead_letter_server(broker_url: str, store: redis.Redis) -> Iterator[redis.Redis | None]:
    """Where the dead letters are kept: a Redis broker's own server (beside its queues), the
    store with RabbitMQ (a worker's consumer writes them there), None for another broker."""
    if amqp.is_amqp(broker_url):
        yield store
        return
    with _redis_broker(broker_url) as broker:
        yield broker


def dead_letter_count(broker_url: str, queue: str, store: redis.Redis) -> int | None:
    """Dead letters of the queue; None for a broker that keeps none."""
    with dead_letter_server(broker_url, store) as server:
        return None if server is None else int(server.llen(keys.dead_letters(queue)))
