"""Submissions (and, counted apart, memory writes) per API key in a fixed window, counted in
one script on the shared store, so several servers behind a load balancer share one limit."""

from __future__ import annotations

import time

import redis

from turnstile.worker.http.problems import Problem
from turnstile.worker.store.api_limits import WriteCounts


class RateLimiter:
    def __init__(self, client: redis.Redis, *, limit: int, window_s: int) -> None:
        self.limit, self.window_s = limit, window_s
        self._counts = WriteCounts(client)

    def take(self, key_id: str, kind: str = "") -> None:
        """Count one submission (or one write of another `kind`, counted apart: memory writes
        have a limit of the same size); 429 with Retry-After when the key's window is full."""
        window = int(time.time()) // self.window_s
        admitted, count, ttl_s = self._counts.take(
            key_id, window, kind, limit=self.limit, window_s=self.window_s
        )
        if not admitted:
            retry = max(1, ttl_s)
            what = f"{kind} writes" if kind else "submissions"
            raise Problem(
                429, "rate_limited",
                f"{count} {what} in this {self.window_s} s window; the limit is {self.limit}",
                {"Retry-After": str(retry)},
            )  # fmt: skip
