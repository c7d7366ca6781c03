"""A no-op Celery task that re-enqueues itself: the baseline for the worker benchmark.

Same Celery settings as Turnstile's app (JSON only, acks late, prefetch 1, reject on worker
lost, events on), so the ratio measures what a turn adds over the queue itself.
"""

from __future__ import annotations

import redis
from celery import Task

from worker.app import make_app
from worker.settings import settings

app = make_app(settings())


@app.task(name="bench.noop", bind=True, acks_late=True, reject_on_worker_lost=True)
def noop(self: Task, remaining: int, queue: str) -> str:  # type: ignore[type-arg]
    """Do nothing, then send the next link of the chain, as a step sends the next step."""
    if remaining > 1:
        self.apply_async(
            kwargs={"remaining": remaining - 1, "queue": queue}, queue=queue, priority=0
        )
        return "continued"
    # No result backend, as in Turnstile: the end of a chain is counted on the broker's server.
    redis.Redis.from_url(str(self.app.conf.broker_url)).incr(f"bench:done:{queue}")
    return "finished"
