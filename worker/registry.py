"""The jobs a worker can run, by name, built once per process over its store."""

from __future__ import annotations

from collections.abc import Callable

import redis

from jobs.errors import UnknownJobError
from jobs.job import Job
from jobs.support.job import NAME as SUPPORT
from jobs.support.job import support_job
from worker.shop import RedisShop

JobFactory = Callable[..., Job]  # (client, *, drills) -> Job


def _support(client: redis.Redis, *, drills: bool = False) -> Job:
    return support_job(RedisShop(client), drills=drills)


FACTORIES: dict[str, JobFactory] = {SUPPORT: _support}


class Jobs:
    """`drills`: whether jobs act on the failure drills a run asks for (TURNSTILE_ALLOW_DRILLS)."""

    def __init__(self, client: redis.Redis, *, drills: bool = False) -> None:
        self.client, self.drills = client, drills
        self._built: dict[str, Job] = {}

    @staticmethod
    def names() -> list[str]:
        return sorted(FACTORIES)

    def get(self, name: str) -> Job:
        if name not in FACTORIES:
            raise UnknownJobError(f"unknown job {name!r}; known jobs: {', '.join(self.names())}")
        if name not in self._built:
            self._built[name] = FACTORIES[name](self.client, drills=self.drills)
        return self._built[name]
