"""The Celery app and the step task: at least once, never pickle, never lose a message.

Nothing is built on import: `worker_app()` builds the worker's app, registers the step task
and connects the worker's signal handlers when a worker starts (`turnstile worker`, or
`celery -A worker.app:app`, whose attribute lookup builds it). A service that imports the
client keeps its own `celery.current_app`; it sends through `producer()`, an app of its own
that is never made current.

Acks are late and a lost worker's message is rejected back to the queue, so a step that dies
mid-turn is delivered again; the version compare-and-set in the store makes every extra
delivery harmless. Prefetch is one: a worker holds only the message it is running.
"""

from __future__ import annotations

import threading
from typing import Any

import structlog
from celery import Celery

from turnstile.worker.broker import deadletters
from turnstile.worker.broker.message import STEP_TASK
from turnstile.worker.runtime import hooks, pools
from turnstile.worker.runtime.pools import Pool
from turnstile.worker.runtime.services import WorkerServices
from turnstile.worker.runtime.task import StepTask, step_task
from turnstile.worker.settings import Settings, settings

log = structlog.get_logger("turnstile.worker")


def make_app(config: Settings, *, broker_url: str | None = None, main: bool = True) -> Celery:
    celery = Celery("turnstile", set_as_current=main)
    url = broker_url or config.broker_url or config.redis_url
    celery.conf.update(
        broker_url=url,
        broker_transport_options={"visibility_timeout": config.visibility_timeout_s},
        broker_connection_retry_on_startup=True,
        task_serializer="json",
        accept_content=["json"],
        result_serializer="json",
        result_backend=None,
        task_ignore_result=True,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_default_queue=config.default_queue,
        task_create_missing_queues=True,
        worker_send_task_events=config.task_events,
        task_send_sent_event=config.task_events,
        worker_hijack_root_logger=False,
        worker_redirect_stdouts=False,  # structlog writes its own lines to stderr
        # A producer per turn in flight on a green worker (each publishes its next step).
        broker_pool_limit=broker_pool_limit(config),
        # A queue entry the worker cannot take in goes to the dead letters, not the worker down.
        **deadletters.celery_config(url or ""),
    )
    return celery


def broker_pool_limit(config: Settings) -> int:
    """Broker connections kept by one process: one per turn a green worker holds in flight,
    else a few (a prefork process runs one turn at a time)."""
    if config.pool == Pool.GEVENT:
        return config.concurrency + pools.SPARE_CONNECTIONS
    return 4


_worker: dict[str, Celery] = {}
_worker_lock = threading.Lock()
_worker_hooks: list[hooks.Hook] = []


def worker_app() -> Celery:
    """The worker's app, built once per process on first use, with the step task and the
    worker's hooks: this is where a worker starts, never at import."""
    with _worker_lock:
        if "app" not in _worker:
            config = settings()
            celery = make_app(config)
            worker = WorkerServices(config, celery)
            # The task carries the worker's services: a prefork pool process, forked from
            # this one, finds them there rather than reading the environment again.
            celery.task(
                name=STEP_TASK, bind=True, base=StepTask, acks_late=True,
                reject_on_worker_lost=True, max_retries=None, worker=worker,
            )(step_task)  # fmt: skip
            _worker_hooks.extend(hooks.worker_hooks(config, worker.send, worker.send_many))
            hooks.install(_worker_hooks)
            _worker["app"] = celery
        return _worker["app"]


def __getattr__(name: str) -> Any:
    """`celery -A worker.app:app` finds the worker's app by this lookup, which builds it."""
    if name == "app":
        return worker_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def announced_exitcode() -> int:
    exits = (h.exitcode() for h in _worker_hooks if isinstance(h, hooks.ExitCodeHook))
    return max(exits, default=0)
