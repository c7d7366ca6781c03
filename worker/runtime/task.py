"""The step task: parse the message, run one turn (worker/runtime/step.py), retry with a
backoff when the store or the ledger is down, give the fair-share slot back."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import structlog
from celery import Celery, Task

from turnstile.backoff import backoff_s
from turnstile.worker.broker.message import STEP_TASK, StepMessage, parse_message
from turnstile.worker.observability import metrics
from turnstile.worker.runtime.eager import Chain
from turnstile.worker.runtime.holds import LedgerDown
from turnstile.worker.runtime.results import RUN_ENDED
from turnstile.worker.runtime.services import WorkerServices
from turnstile.worker.runtime.step import Step
from turnstile.worker.scheduling import fair
from turnstile.worker.store.runs import StoreUnavailable

log = structlog.get_logger("turnstile.worker")


class StepTask(Task[..., str]):
    """The step task's class: `worker` is the worker's services, set when the task is
    registered on the worker's app."""

    worker: WorkerServices


def register(app: Celery, worker: WorkerServices) -> None:
    """Register the step task on the worker's app. The task's class carries the worker's
    services: a prefork pool process, forked from the main one, finds its Settings there
    rather than reading the environment again."""
    app.task(
        name=STEP_TASK, bind=True, base=StepTask, acks_late=True, reject_on_worker_lost=True,
        max_retries=None, worker=worker,
    )(step_task)  # fmt: skip


def step_task(self: StepTask, *args: Any, **kwargs: Any) -> str:
    """Run one turn of a run, then each turn its commit claims (eager continuation, see
    worker/runtime/step.py): one delivery may run several turns of its run in a row, each
    counted as a step. Malformed messages are logged and acked; the run, where it can be
    told, ends `error` with the reason."""
    msg = parse_message(args, kwargs)
    if isinstance(msg, str):
        started = metrics.step_started()
        log.error(
            "malformed_step_message", reason=msg, args=repr(args)[:200], kwargs=repr(kwargs)[:400]
        )
        _fail_named_run(self.worker, kwargs, msg)
        metrics.step_done("malformed", started)
        return "malformed"
    # A delivery that exits cleanly (store or ledger down) names itself to its retry as
    # `after`, so that it does not count as a delivery that died mid-turn.
    after = kwargs.get("after")
    # The delivery's hard time limit, which Celery enforces on every turn it runs: a claimed
    # turn must fit in it (see worker/runtime/eager.py).
    hard_s = (self.request.timelimit or (None, None))[0]
    chain = Chain(
        delivery=f"{self.request.id}:{self.request.retries}",
        eager=self.worker.settings.eager_turns,
        deadline=time.monotonic() + float(hard_s) if hard_s else None,
    )

    def first() -> Step:
        return Step(
            self.worker.services(), msg, chain, after=after if isinstance(after, str) else ""
        )

    result, step = _one_step(self, msg, first)
    while step is not None and (following := step.following) is not None:
        result, step = _one_step(self, following.msg, lambda f=following: f)  # type: ignore[misc]
    return result


def _one_step(
    task: StepTask, msg: StepMessage, build: Callable[[], Step]
) -> tuple[str, Step | None]:
    """Run the step `build` makes: (what it returned, the step). Retries with a backoff when
    the store or the ledger is down; gives the step's fair-share slot back when it is done."""
    started, result = metrics.step_started(), "exception"
    structlog.contextvars.bind_contextvars(
        tenant=msg.tenant, run_id=msg.run_id, version=msg.version
    )
    step: Step | None = None
    try:
        step = build()
        result = step.run()
        return result, step
    except (LedgerDown, StoreUnavailable) as exc:
        config = task.worker.settings
        delay = backoff_s(
            task.request.retries + 1, base_s=config.retry_base_s, max_s=config.retry_max_s,
            jitter=0.25,
        )  # fmt: skip
        log.warning("step_retry", error=str(exc), countdown_s=round(delay, 2))
        result = "retry"
        metrics.step_retried("ledger_down" if isinstance(exc, LedgerDown) else "store_unavailable")
        retry_kwargs = {**msg.as_kwargs(), "after": step.clean_exit if step else ""}
        raise task.retry(countdown=delay, exc=exc, kwargs=retry_kwargs) from exc
    finally:
        metrics.step_done(result, started)
        structlog.contextvars.clear_contextvars()
        # A retry keeps the step's slot until its last delivery; a continuing run's next
        # step took it over as it was queued or claimed (worker/scheduling/fair.py); a run
        # that stopped, parked or suspended gave it back with its commit (commits.py `slot`).
        released = step is not None and step.writer is not None and step.writer.released
        if result not in ("retry", "continued") and not released:
            _release(task.worker, msg, result)


def _release(worker: WorkerServices, msg: StepMessage, result: str) -> None:
    """Give the step's fair-share slot back (see worker/scheduling/fair.py)."""
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
