"""Dead letters where they are kept: on a Redis broker's own server, beside its queues, or in
the store with RabbitMQ. Each queue's are a list of JSON records, newest first (keys.
dead_letters), and a set names the queues that have some. What a dead letter is, and when a
worker makes one, is worker/broker/deadletters.py's.
"""

from __future__ import annotations

import redis

from turnstile.worker.store import keys
from turnstile.worker.store.values import is_cluster_client, text


def keep(server: redis.Redis, queue: str, record: str, most: int) -> None:
    """Push a dead letter's record, keeping the newest `most` of the queue's. One transaction
    on a single server; on a cluster (RabbitMQ's dead letters in a cluster store) the list and
    the set of queues are in different slots, so each is written on its own node."""
    pipe = server.pipeline(transaction=not is_cluster_client(server))
    pipe.lpush(keys.dead_letters(queue), record)
    pipe.ltrim(keys.dead_letters(queue), 0, most - 1)
    pipe.sadd(keys.DEAD_LETTER_QUEUES, queue)
    pipe.execute()


def queues(server: redis.Redis) -> list[str]:
    """The queues that have dead letters, by name."""
    return sorted(text(q) for q in server.smembers(keys.DEAD_LETTER_QUEUES))


def newest(server: redis.Redis, queue: str, most: int | None = None) -> list[str]:
    """The queue's records, newest first; at most `most` (None: all of them)."""
    end = -1 if most is None else most - 1
    return [text(e) for e in server.lrange(keys.dead_letters(queue), 0, end)]


def count(server: redis.Redis, queue: str) -> int:
    return int(server.llen(keys.dead_letters(queue)))


def drop_all(server: redis.Redis, queue: str) -> int:
    """Remove every dead letter of the queue; how many there were."""
    gone = count(server, queue)
    server.delete(keys.dead_letters(queue))
    server.srem(keys.DEAD_LETTER_QUEUES, queue)
    return gone


def drop(server: redis.Redis, queue: str, record: str) -> int:
    """Remove one record from the queue's dead letters; 1 if it was there, else 0."""
    return int(server.lrem(keys.dead_letters(queue), 1, record))
