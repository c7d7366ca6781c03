"""How a queue lies on the broker. On Redis, as kombu's Redis transport lays it out: one list
per priority step, and Turnstile's dead letters beside them. On RabbitMQ (amqp.py), a quorum
queue whose ready messages a passive `queue.declare` counts, and the dead letters in the
store. The one place that knows it; the dispatcher (its depth) and the operator's queue views
(depth, dead letters) read it here.

Turnstile's queues have a namespace of their own on the broker: the queue a client names,
`default`, is the broker queue `turnstile.q.default` (`broker_queue`), with its exchange and
routing key of that name, and its priority lists `turnstile.q.default\x06\x163` and so on. No
name a client gives can then be one of the keys kombu's Redis transport keeps beside the
queues on the same server (`unacked`, `unacked_index`, `unacked_mutex`, `_kombu.binding.*`),
one of Celery's (`celery`, `celeryev...`, `*.pidbox`, `celery_delayed_*`) or one RabbitMQ
reserves (`amq.*`): none of them starts with the prefix. Every name the rest of Turnstile
speaks (the store, the step message, the CLI, the HTTP API, a worker's `--queues`) is the
client's; it becomes the broker's here and in the Celery app's queue table (namespace.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import redis

from turnstile.worker.broker import amqp
from turnstile.worker.store import deadletters as kept

# The Redis transport keeps a queue's messages in one list per priority step; step 0 is the
# bare queue name. kombu's defaults, which Turnstile's Celery app does not change.
PRIORITY_STEPS = (0, 3, 6, 9)
PRIORITY_SEP = "\x06\x16"
REDIS_SCHEMES = ("redis://", "rediss://", "unix://")

# Every queue of Turnstile's on the broker starts with this (a queue name may not: names.py).
QUEUE_PREFIX = "turnstile.q."

# A queue's depth: the messages waiting on the broker, by queue name.
Depth = Callable[[str], int]


def is_redis(broker_url: str) -> bool:
    return broker_url.startswith(REDIS_SCHEMES)


def broker_queue(queue: str) -> str:
    """The broker's name of a Turnstile queue (its queue, exchange and routing key): the
    prefix and the name. A name that has the prefix already is the broker's (the Celery app
    is given either, see namespace.py; a Turnstile queue name never has it)."""
    return queue if queue.startswith(QUEUE_PREFIX) else QUEUE_PREFIX + queue


def turnstile_queue(name: str) -> str:
    """The Turnstile queue a broker queue (or routing key) is, for what a worker reports: the
    name without the prefix; a name without it is returned as it is."""
    return name.removeprefix(QUEUE_PREFIX)


def priority_lists(queue: str) -> list[str]:
    """The broker lists that hold the Turnstile queue's messages, one per priority step."""
    name = broker_queue(queue)
    return [f"{name}{PRIORITY_SEP}{pri}" if pri else name for pri in PRIORITY_STEPS]


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
        return amqp.QueueDepth(broker_url, name=broker_queue)
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
        with amqp.QueueDepth(broker_url, name=broker_queue) as depth:
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
        return None if server is None else kept.count(server, queue)
