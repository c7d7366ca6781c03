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

import random
import threading
from typing import Any

import structlog
from celery import Celery, Task

from turnstile.worker.broker import deadletters
from turnstile.worker.broker.message import STEP_TASK, StepMessage, parse_message
from turnstile.worker.observability import metrics
from turnstile.worker.runtime import hooks, pools
from turnstile.worker.runtime.pools import Pool
from turnstile.worker.runtime.services import WorkerServices
from turnstile.worker.runtime.step import LedgerDown, Step
from turnstile.worker.scheduling import fair
from turnstile.worker.settings import Settings, settings
from turnstile.worker.store.runs import StoreUnavailable

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


def compute_backoff(attempts: int, *, base_s: float, max_s: float, jitter: float = 0.25) -> float:
    """Exponential backoff with jitter, capped: base * 2^attempts, give or take a quarter."""
    delay = min(max_s, base_s * 2.0 ** min(attempts, 30))
    return max(0.0, delay * (1 + random.uniform(-jitter, jitter)))


class StepTask(Task[..., str]):
    """The step task's class: `worker` is the worker's services, set when the task is
    registered on the worker's app."""

    worker: WorkerServices


def step_task(self: StepTask, *args: Any, **kwargs: Any) -> str:
    """Run one turn of a run. Malformed messages are logged and acked; the run, where it can
    be told, ends `error` with the reason."""
    started, result = metrics.step_started(), "exception"
    msg = parse_message(args, kwargs)
    if isinstance(msg, str):
        log.error(
            "malformed_step_message", reason=msg, args=repr(args)[:200], kwargs=repr(kwargs)[:400]
        )
        _fail_named_run(self.worker, kwargs, msg)
        metrics.step_done("malformed", started)
        return "malformed"
    structlog.contextvars.bind_contextvars(
        tenant=msg.tenant, run_id=msg.run_id, version=msg.version
    )
    # A delivery that exits cleanly (store or ledger down) names itself to its retry as
    # `after`, so that it does not count as a delivery that died mid-turn.
    after = kwargs.get("after")
    step: Step | None = None
    try:
        delivery = f"{self.request.id}:{self.request.retries}"
        step = Step(self.worker.services(), msg, delivery=delivery,
                    after=after if isinstance(after, str) else "")  # fmt: skip
        result = step.run()
        return result
    except (LedgerDown, StoreUnavailable) as exc:
        config = self.worker.settings
        delay = compute_backoff(
            self.request.retries, base_s=config.retry_base_s, max_s=config.retry_max_s
        )
        log.warning("step_retry", error=str(exc), countdown_s=round(delay, 2))
        result = "retry"
        metrics.step_retried("ledger_down" if isinstance(exc, LedgerDown) else "store_unavailable")
        retry_kwargs = {**msg.as_kwargs(), "after": step.clean_exit if step else ""}
        raise self.retry(countdown=delay, exc=exc, kwargs=retry_kwargs) from exc
    finally:
        metrics.step_done(result, started)
        structlog.contextvars.clear_contextvars()
        # A retry keeps the step's slot until its last delivery; a continuing run's next
        # step gave it back as it was queued (worker/fair.py).
        if result not in ("retry", "continued"):
            _release(self.worker, msg, result)


# Results of a step after which its run is over (see worker/step.py and step_task).
RUN_ENDED = frozenset({"finished", "refused", "cancelled", "broken", "poison", "missing"})


def _release(worker: WorkerServices, msg: StepMessage, result: str) -> None:
    """Give the step's fair-share slot back (see worker/fair.py)."""
    if not worker.settings.fair_share:
        return
    try:
        fair.release(worker.services().store.client, msg.tenant, msg.run_id, msg.version,
                     ended=result in RUN_ENDED)  # fmt: skip
    except Exception as exc:  # the slot lapses by itself
        log.warning("slot_release_failed", error=str(exc))


def _fail_named_run(worker: WorkerServices, kwargs: dict[str, Any], reason: str) -> None:
    tenant, run_id = kwargs.get("tenant"), kwargs.get("run_id")
    if not (isinstance(tenant, str) and tenant and isinstance(run_id, str) and run_id):
        return
    try:
        worker.services().store.fail_run(tenant, run_id, f"malformed step message: {reason}")
    except Exception as exc:
        log.error("fail_run_failed", error=str(exc))


def announced_exitcode() -> int:
    exits = (h.exitcode() for h in _worker_hooks if isinstance(h, hooks.ExitCodeHook))
    return max(exits, default=0)
