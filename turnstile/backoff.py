"""The one backoff: a step retried while the store is down, a webhook delivery, a model call."""

from __future__ import annotations

import random


def backoff_s(failures: int, *, base_s: float, max_s: float, jitter: float = 0.0) -> float:
    """Seconds to wait after `failures` failed tries (1 or more): base, 2 base, 4 base ...,
    capped at `max_s`, then give or take `jitter` of it (0.25: a quarter), so that many waiters
    do not come back together."""
    delay = min(max_s, base_s * 2.0 ** min(max(failures - 1, 0), 30))
    if jitter:
        delay *= 1 + random.uniform(-jitter, jitter)
    return max(0.0, delay)
