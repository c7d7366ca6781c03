"""What every reader of the store does alike: a reply's bytes as text, and the store's clock."""

from __future__ import annotations

from typing import Any

import redis
from redis.cluster import RedisCluster
from redis.exceptions import ClusterDownError, SlotNotCoveredError, TryAgainError


def text(value: Any) -> str:
    """A reply as text: bytes decoded, None as "" (a missing field), anything else as str."""
    if isinstance(value, bytes):
        return value.decode()
    return "" if value is None else str(value)


def server_ms(client: redis.Redis) -> int:
    """The store's own clock, in ms: the one every worker, sweeper and dispatcher agrees on,
    whatever their machines' clocks say."""
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


# What a store that is down, or a cluster in the middle of a failover, raises: the caller
# retries later (every write is a versioned script, so running one again is a no-op).
UNAVAILABLE: tuple[type[Exception], ...] = (
    redis.ConnectionError,
    redis.TimeoutError,
    ClusterDownError,
    TryAgainError,
    SlotNotCoveredError,
)


def is_cluster_client(client: Any) -> bool:
    """Whether `client` is a cluster's (a `redis+cluster://` URL): there a transaction takes
    one slot, and a pipeline's commands for different nodes run in no set order."""
    return isinstance(client, RedisCluster)
