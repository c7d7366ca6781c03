"""A no-op Celery task that re-enqueues itself: the baseline for the worker benchmark.

Same Celery settings as Turnstile's app (JSON only, acks late, prefetch 1, reject on worker
lost, task events as TURNSTILE_TASK_EVENTS says), so the ratio measures what a turn adds over
the queue itself.
"""

from __future__ import annotations

import functools

import redis
from celery import Task, signals

from turnstile.worker.runtime.app import make_app
from turnstile.worker.settings import Settings

app = make_app(Settings())
SOFT_LIMIT_S, HARD_LIMIT_S = 38, 40  # what a step of a 30 s run is sent with


@app.task(name="bench.noop", bind=True, acks_late=True, reject_on_worker_lost=True)
def noop(self: Task, remaining: int, queue: str) -> str:  # type: ignore[type-arg]
    """Do nothing, then send the next link of the chain, as a step sends the next step, with
    the time limits a step is sent with."""
    if remaining > 1:
        self.apply_async(
            kwargs={"remaining": remaining - 1, "queue": queue},
            queue=queue,
            priority=0,
            soft_time_limit=SOFT_LIMIT_S,
            time_limit=HARD_LIMIT_S,
        )
        return "continued"
    # No result backend, as in Turnstile: the end of a chain is counted on the broker's server,
    # over one connection per process (a step, too, reuses its connections).
    _counter(str(self.app.conf.broker_url)).incr(f"bench:done:{queue}")
    return "finished"


@signals.worker_ready.connect
def _ready(**kwargs: object) -> None:
    """The line the bench waits for, as Turnstile's worker logs it."""
    print('{"event": "worker_ready"}', flush=True)


@functools.cache
def _counter(url: str) -> redis.Redis:
    return redis.Redis.from_url(url)
