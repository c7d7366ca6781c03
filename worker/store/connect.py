"""The one way to open a client of the store: its timeouts from the Settings, and a bounded
pool for a worker that holds many turns in flight."""

from __future__ import annotations

from typing import Any

import redis

from turnstile.worker.settings import Settings


def connect(url: str, config: Settings, *, max_connections: int | None = None) -> redis.Redis:
    """A client of the store. A worker's step services bound its pool to the turns the process
    holds in flight (`max_connections`): a turn past the bound waits for a connection, up to
    the socket timeout, instead of opening more. A client of a service is not bounded."""
    options: dict[str, Any] = {
        "decode_responses": True,
        "socket_timeout": config.redis_timeout_s,
        "socket_connect_timeout": min(1.0, config.redis_timeout_s),
        "health_check_interval": 30,
    }
    if max_connections is None:
        return redis.Redis.from_url(url, **options)
    pool = redis.BlockingConnectionPool.from_url(
        url, max_connections=max_connections, timeout=config.redis_timeout_s, **options
    )
    return redis.Redis(connection_pool=pool)
