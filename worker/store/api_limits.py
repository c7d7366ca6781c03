"""The HTTP API's shared counts, one script each, so that servers behind a load balancer share
one limit: an API key's writes in a fixed window (rate.lua: http_keys.rate) and the event
streams it holds open (streams.lua: http_keys.streams, a member per stream, lapsing unless its
server renews it). The limits themselves are the HTTP layer's (http/ratelimit.py,
http/streams.py)."""

from __future__ import annotations

from typing import Any

import redis
import redis.asyncio as aioredis

from turnstile.worker.store import http_keys
from turnstile.worker.store.scripts import ScriptCall, register


def rate_call(key_id: str, window: int, kind: str, *, limit: int, window_s: int) -> ScriptCall:
    """rate.lua: one more write of `kind` ("" for submissions) by the key in `window`."""
    return ScriptCall([http_keys.rate(key_id, window, kind)], [limit, window_s])


def streams_call(
    key_id: str, action: str, stream_id: str, *, lease_ms: int, cap: int
) -> ScriptCall:
    """streams.lua: `action` ("open", "renew" or "close") on one of the key's streams."""
    return ScriptCall([http_keys.streams(key_id)], [action, stream_id, lease_ms, cap])


class WriteCounts:
    """Each key's writes per window (rate.lua)."""

    def __init__(self, client: redis.Redis) -> None:
        self._script = register(client, "rate")

    def take(
        self, key_id: str, window: int, kind: str, *, limit: int, window_s: int
    ) -> tuple[bool, int, int]:
        """Count one write: (admitted, the window's count, its seconds left)."""
        call = rate_call(key_id, window, kind, limit=limit, window_s=window_s)
        admitted, count, ttl_s = self._script(keys=call.keys, args=call.args)
        return bool(int(admitted)), int(count), int(ttl_s)


class OpenStreams:
    """Each key's open event streams (streams.lua), from a thread or from the loop."""

    def __init__(self, client: redis.Redis, streams: aioredis.Redis, *, lease_ms: int,
                 cap: int) -> None:  # fmt: skip
        self.lease_ms, self.cap = lease_ms, cap
        self._script = register(client, "streams")
        self._async_script = register(streams, "streams")

    def _call(self, key_id: str, action: str, stream_id: str) -> ScriptCall:
        return streams_call(key_id, action, stream_id, lease_ms=self.lease_ms, cap=self.cap)

    def open(self, key_id: str, stream_id: str) -> tuple[bool, int]:
        """Count one more stream of the key unless it is at its cap: (admitted, open now)."""
        call = self._call(key_id, "open", stream_id)
        admitted, count = self._script(keys=call.keys, args=call.args)
        return bool(int(admitted)), int(count)

    async def call(self, action: str, key_id: str, stream_id: str) -> Any:
        """ "renew" or "close" one of the key's streams, on the loop."""
        call = self._call(key_id, action, stream_id)
        return await self._async_script(keys=call.keys, args=call.args)
