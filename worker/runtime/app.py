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

import os
import random
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import structlog
from celery import Celery, Task

from turnstile.jobs.kernel import READ_POOL_SIZE
from turnstile.ledger.client import Ledger
from turnstile.ledger.inputs import DEFAULT_DIMENSIONS
from turnstile.worker.broker import deadletters, producer
from turnstile.worker.broker.message import STEP_TASK, StepMessage, parse_message
from turnstile.worker.observability import metrics
from turnstile.worker.registry import Jobs
from turnstile.worker.runtime import hooks, pools
from turnstile.worker.runtime.limits import time_limits
from turnstile.worker.runtime.pools import Pool
from turnstile.worker.runtime.step import Heartbeat, LedgerDown, Services, Step
from turnstile.worker.scheduling import fair
from turnstile.worker.settings import Settings, settings
from turnstile.worker.store.connect import connect
from turnstile.worker.store.runs import RunStore, StoreUnavailable

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


def redis_max_connections(config: Settings) -> int:
    """Redis connections one worker process may open to the store: for each turn in flight,
    its own and one per parallel tool call (a tool may read the store), then the heartbeat
    and a few spares."""
    turns = config.concurrency if config.pool == Pool.GEVENT else 1
    return turns * (1 + READ_POOL_SIZE) + pools.SPARE_CONNECTIONS


_worker: dict[str, Celery] = {}
_worker_lock = threading.Lock()
_worker_hooks: list[hooks.Hook] = []


def worker_app() -> Celery:
    """The worker's app, built once per process on first use, with the step task and the
    worker's signal handlers: this is where a worker starts, never at import."""
    with _worker_lock:
        if "app" not in _worker:
            celery = make_app(settings())
            celery.task(
                name=STEP_TASK, bind=True, acks_late=True, reject_on_worker_lost=True,
                max_retries=None,
            )(step_task)  # fmt: skip
            _worker_hooks.extend(hooks.worker_hooks(settings(), send_step, send_steps))
            hooks.install(_worker_hooks)
            _worker["app"] = celery
        return _worker["app"]


def __getattr__(name: str) -> Any:
    """`celery -A worker.app:app` finds the worker's app by this lookup, which builds it."""
    if name == "app":
        return worker_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_services: dict[int, Services] = {}
_lock = threading.Lock()


def send_step(msg: StepMessage, soft_s: float, hard_s: float) -> None:
    producer.send_step(worker_app(), msg, soft_s, hard_s)


def send_steps(batch: list[tuple[StepMessage, float, float]]) -> None:
    producer.send_steps(worker_app(), batch)


def build_services(config: Settings) -> Services:
    if config.redis_url is None:
        raise StoreUnavailable("no store: set TURNSTILE_REDIS_URL")
    client = connect(config.redis_url, config, max_connections=redis_max_connections(config))
    jobs = Jobs(client, drills=config.allow_drills)
    ledger = Ledger.from_url(
        config.redis_url, grace_s=config.ledger_grace_s,
        dimensions=(*DEFAULT_DIMENSIONS, *jobs.dimensions()),
    )  # fmt: skip
    store = RunStore(client, ledger, wait_for=config.wait_for)
    route = fair.route(client, config, send_step)

    sends = iter(range(1, 2**62))

    def send(msg: StepMessage, state: Any) -> None:
        soft_s, hard_s = time_limits(state, config)
        if config.chaos_drop_every and next(sends) % config.chaos_drop_every == 0:
            log.warning("chaos_send_dropped", version=msg.version)
            return
        try:
            route(msg, soft_s, hard_s)
            for _ in range(config.chaos_send_copies - 1):  # the drill's duplicates, as they
                send_step(msg, soft_s, hard_s)  # come: past the pending list, which folds them
        except Exception as exc:  # the lease the commit set makes the sweeper send it later
            log.warning("enqueue_failed", error=str(exc), version=msg.version)

    # With fair share on, a run's next step is queued by the commit itself (worker/fair.py,
    # run_commit.lua); not in the drills, which stand in the gap between a commit and its
    # send. With a durability wait, a worker may take the step while the commit's wait is
    # under way (milliseconds): a crash then loses that turn with the commit it followed, and
    # it runs again from the durable version, its writes replayed by their keys, as a turn
    # killed mid-flight does.
    queues_in_commit = (
        config.fair_share and not config.chaos_drop_every and config.chaos_send_copies == 1
    )

    def next_step(msg: StepMessage, state: Any) -> fair.Pending | None:
        if not queues_in_commit:
            return None
        return fair.pending_entry(msg, *time_limits(state, config))

    turns = config.concurrency if config.pool == Pool.GEVENT else 1
    return Services(
        settings=config,
        store=store,
        ledger=ledger,
        jobs=jobs,
        send=send,
        next_step=next_step,
        heartbeat=Heartbeat(config.inflight_lease_s / 3),
        # Tool calls of every turn in flight: greenlets on a green worker, so one set per turn.
        pool=ThreadPoolExecutor(READ_POOL_SIZE * turns, "turnstile-tool"),
    )


def services() -> Services:
    """This process's services, built after any fork: connections are never shared."""
    pid = os.getpid()
    with _lock:
        if pid not in _services:
            _services.clear()
            _services[pid] = build_services(settings())
        return _services[pid]


def compute_backoff(attempts: int, *, base_s: float, max_s: float, jitter: float = 0.25) -> float:
    """Exponential backoff with jitter, capped: base * 2^attempts, give or take a quarter."""
    delay = min(max_s, base_s * 2.0 ** min(attempts, 30))
    return max(0.0, delay * (1 + random.uniform(-jitter, jitter)))


def step_task(self: Task, *args: Any, **kwargs: Any) -> str:  # type: ignore[type-arg]
    """Run one turn of a run. Malformed messages are logged and acked; the run, where it can
    be told, ends `error` with the reason."""
    started, result = metrics.step_started(), "exception"
    msg = parse_message(args, kwargs)
    if isinstance(msg, str):
        log.error(
            "malformed_step_message", reason=msg, args=repr(args)[:200], kwargs=repr(kwargs)[:400]
        )
        _fail_named_run(kwargs, msg)
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
        step = Step(services(), msg, delivery=f"{self.request.id}:{self.request.retries}",
                    after=after if isinstance(after, str) else "")  # fmt: skip
        result = step.run()
        return result
    except (LedgerDown, StoreUnavailable) as exc:
        config = settings()
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
            _release(msg, result)


# Results of a step after which its run is over (see worker/step.py and step_task).
RUN_ENDED = frozenset({"finished", "refused", "cancelled", "broken", "poison", "missing"})


def _release(msg: StepMessage, result: str) -> None:
    """Give the step's fair-share slot back (see worker/fair.py)."""
    if not settings().fair_share:
        return
    try:
        fair.release(services().store.client, msg.tenant, msg.run_id, msg.version,
                     ended=result in RUN_ENDED)  # fmt: skip
    except Exception as exc:  # the slot lapses by itself
        log.warning("slot_release_failed", error=str(exc))


def _fail_named_run(kwargs: dict[str, Any], reason: str) -> None:
    tenant, run_id = kwargs.get("tenant"), kwargs.get("run_id")
    if not (isinstance(tenant, str) and tenant and isinstance(run_id, str) and run_id):
        return
    try:
        services().store.fail_run(tenant, run_id, f"malformed step message: {reason}")
    except Exception as exc:
        log.error("fail_run_failed", error=str(exc))


def announced_exitcode() -> int:
    exits = (h.exitcode() for h in _worker_hooks if isinstance(h, hooks.ExitCodeHook))
    return max(exits, default=0)
