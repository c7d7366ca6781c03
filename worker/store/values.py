"""What every reader and writer of the store does alike: a reply's bytes as text, the store's
clock, and the values written beside a run (its submission's fingerprint, a time, an excerpt)."""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import msgspec
import redis
from redis.cluster import RedisCluster
from redis.exceptions import ClusterDownError, SlotNotCoveredError, TryAgainError


def text(value: Any) -> str:
    """A reply as text: bytes decoded, None as "" (a missing field), anything else as str."""
    if isinstance(value, bytes):
        return value.decode()
    return "" if value is None else str(value)


REASON_MAX_CHARS = 500  # a stored reason is an excerpt: a message's arguments can be megabytes


def one_line(text: str, limit: int = 300) -> str:
    """`text` on one line, at most `limit` characters (an ellipsis says it was cut)."""
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def fingerprint(payload: Any) -> str:
    return hashlib.sha256(msgspec.json.encode(payload, order="sorted")).hexdigest()[:24]


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def excerpt(text: str, limit: int = REASON_MAX_CHARS) -> str:
    """At most `limit` characters of `text`, saying how much was cut."""
    if len(text) <= limit:
        return text
    return f"{text[: limit - 40]}... ({len(text) - limit + 40} more characters)"


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


@contextlib.contextmanager
def writing(client: redis.Redis, pipe: Any | None = None) -> Iterator[Any]:
    """Where a writer adds its commands: the caller's pipeline `pipe`, which its owner runs
    with its own writes (so they go together, as rq's writers take one), or a pipeline of its
    own, run when the block ends."""
    if pipe is not None:
        yield pipe
        return
    own = client.pipeline(transaction=False)
    yield own
    own.execute()


def is_cluster_client(client: Any) -> bool:
    """Whether `client` is a cluster's (a `redis+cluster://` URL): there a transaction takes
    one slot, and a pipeline's commands for different nodes run in no set order."""
    return isinstance(client, RedisCluster)
