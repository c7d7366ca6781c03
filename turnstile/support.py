"""The built-in support job's factory, registered through the `turnstile.jobs` entry point
like any other job."""

from __future__ import annotations

import redis

from turnstile.jobs.job import Job
from turnstile.jobs.support.job import support_job
from turnstile.jobs.support.shop import InMemoryShop
from turnstile.worker.dev.shop import RedisShop


def support(client: redis.Redis | None = None, *, drills: bool = False) -> Job:
    """Over the worker's store (a Redis shop), or, with no client, a shop of its own; failure
    drills act only where the worker allows them (TURNSTILE_ALLOW_DRILLS)."""
    return support_job(InMemoryShop() if client is None else RedisShop(client), drills=drills)
