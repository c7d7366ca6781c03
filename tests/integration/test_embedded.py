"""The embedded server starts on a free port, answers, and comes back with its data after a stop."""

from __future__ import annotations

import redis

from turnstile.worker.dev.embedded import EmbeddedServer
from turnstile.worker.store.durability import config_reply


def test_embedded_server_keeps_data_across_restart_with_aof() -> None:
    """A server run with AOF, as in production (fsynced before every reply, which durability
    `aof` needs), keeps its keys across a stop and start."""
    with EmbeddedServer(appendonly=True) as server:
        client = redis.Redis.from_url(server.url)
        assert config_reply(client.config_get("appendfsync")) == {"appendfsync": "always"}
        client.set("k", "v")
        client.close()
        server.stop()
        server.start()
        client = redis.Redis.from_url(server.url)
        assert client.get("k") == b"v"
        client.close()
