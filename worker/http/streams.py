"""A cap on the event streams one API key holds open at once, shared by every server.

Each open stream holds a store connection for as long as it lasts, so a client that opens
streams without end would take the store's connections from everyone else. A stream counts
while its server renews it (every time its read of the run's events returns, at least once a
block); one whose server died lapses after a few blocks and stops counting.
"""

from __future__ import annotations

import contextlib
import math
import secrets
import time

import anyio
import redis
import redis.asyncio as aioredis

from turnstile.worker.http.problems import Problem
from turnstile.worker.store.api_limits import OpenStreams

RENEW_EVERY_S = 1.0  # a busy stream renews at most this often


class StreamSlot:
    """One open stream's place under its key's cap."""

    def __init__(self, slots: StreamSlots, key_id: str, stream_id: str) -> None:
        self.slots, self.key_id, self.stream_id = slots, key_id, stream_id
        self.renewed_at = time.monotonic()

    async def renew(self) -> None:
        """Keep counting this stream; a store that does not answer is the stream's own
        problem (its read fails the same way), not the cap's."""
        if time.monotonic() - self.renewed_at < RENEW_EVERY_S:
            return
        self.renewed_at = time.monotonic()
        await self.slots.call_async("renew", self.key_id, self.stream_id)

    async def close(self) -> None:
        # Shielded: a stream ends by its client going away, which cancels what awaits here.
        # A store that does not answer: the member lapses on its own.
        with (
            anyio.CancelScope(shield=True),
            contextlib.suppress(redis.ConnectionError, redis.TimeoutError),
        ):
            await self.slots.call_async("close", self.key_id, self.stream_id)


class StreamSlots:
    def __init__(
        self, client: redis.Redis, streams: aioredis.Redis, *, cap: int, block_ms: int
    ) -> None:
        self.cap = cap
        self.block_ms = block_ms
        # A stream is renewed at least once a block; three blocks without it and it lapses.
        self.lease_ms = 3 * block_ms + 2000
        self._open = OpenStreams(client, streams, lease_ms=self.lease_ms, cap=cap)

    def open(self, key_id: str) -> StreamSlot:
        """A place for one more stream of the key; 429 with Retry-After at the cap."""
        stream_id = secrets.token_hex(8)
        admitted, count = self._open.open(key_id, stream_id)
        if not admitted:
            raise Problem(
                429, "too_many_streams",
                f"{count} event streams open for this key; the limit is {self.cap}",
                # A closed stream is noticed within a block, when the server next writes.
                {"Retry-After": str(max(1, math.ceil(self.block_ms / 1000)))},
            )  # fmt: skip
        return StreamSlot(self, key_id, stream_id)

    async def call_async(self, action: str, key_id: str, stream_id: str) -> None:
        await self._open.call(action, key_id, stream_id)
