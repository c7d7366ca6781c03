"""The step message as it travels on the broker: the task's name, its arguments, its priority
and its time limits. Plain data: the client, the scheduler and the worker's task all speak it,
and none of them imports Celery to do so."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from turnstile.worker.store.runs import excerpt

STEP_TASK = "turnstile.step"
# On the Redis transport 0 is served first. A run's later steps go ahead of new runs' first
# steps, so a tenant at its cap finishes the runs it started instead of leaving many half done.
CONTINUE_PRIORITY = 0
START_PRIORITY = 9
# AMQP counts the other way: the higher is served first. A quorum queue on RabbitMQ 4 has two
# levels (5 and above is high); on RabbitMQ 3 it has none and ignores them (see amqp.py).
AMQP_CONTINUE_PRIORITY = 9
AMQP_START_PRIORITY = 0
# With fair share on, the dispatcher has put the steps in order (tenants, priorities, aging):
# it publishes them all at one priority, so the broker keeps that order (a step of another
# priority step published later would go ahead of it, and a steady stream of them for good).
DISPATCHED_PRIORITY = 0
MAX_TRACEPARENT_CHARS = 128


@dataclass(frozen=True)
class StepMessage:
    tenant: str
    run_id: str
    version: int
    queue: str
    traceparent: str = ""  # the run's W3C trace context, so all its turns share one trace

    def as_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "tenant": self.tenant,
            "run_id": self.run_id,
            "version": self.version,
            "queue": self.queue,
        }
        if self.traceparent:
            kwargs["traceparent"] = self.traceparent
        return kwargs


def parse_message(args: tuple[Any, ...], kwargs: dict[str, Any]) -> StepMessage | str:
    """The step's arguments, or why they are not a step message."""
    if args:  # an excerpt: the arguments can be megabytes, and the reason is stored
        return excerpt(f"positional arguments are not accepted: {list(args)[:4]!r}", 300)
    tenant, run_id, version, queue = (
        kwargs.get(k) for k in ("tenant", "run_id", "version", "queue")
    )
    if not isinstance(tenant, str) or not tenant or not isinstance(run_id, str) or not run_id:
        return "tenant and run_id must be non-empty strings"
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        return "version must be a positive integer"
    if not isinstance(queue, str) or not queue:
        return "queue must be a non-empty string"
    traceparent = kwargs.get("traceparent")  # optional; a bad one only costs the trace link
    if not isinstance(traceparent, str) or len(traceparent) > MAX_TRACEPARENT_CHARS:
        traceparent = ""
    return StepMessage(tenant, run_id, version, queue, traceparent)


def priority(msg: StepMessage, *, amqp: bool = False, dispatched: bool = False) -> int:
    """The step's broker priority: one for every step the fair-share dispatcher sends
    (`dispatched`: it keeps the place it was given), else a run's next step ahead of a new
    run's first, in the Redis transport's order or in AMQP's (`amqp`)."""
    if dispatched:
        return DISPATCHED_PRIORITY
    if amqp:
        return AMQP_CONTINUE_PRIORITY if msg.version > 1 else AMQP_START_PRIORITY
    return CONTINUE_PRIORITY if msg.version > 1 else START_PRIORITY


# Celery's headers give a task's arguments as text of at most this many characters.
_ARGUMENT_TEXT_CHARS = 1024


def _argument_texts(kwargs: dict[str, Any]) -> dict[str, str]:
    """The headers' texts of a step's arguments, made here when they are plain: Celery makes
    them with its `saferepr` (about 27 us a step, against 1 us for `repr`), whose text for short
    printable strings and integers is `repr`'s (tests/unit/test_message.py); else Celery's."""
    text = repr(kwargs)
    plain = all(type(v) is int or (v.isascii() and v.isprintable()) for v in kwargs.values())
    if not plain or len(text) > _ARGUMENT_TEXT_CHARS:
        return {}
    return {"argsrepr": "()", "kwargsrepr": text}


def publish_options(
    msg: StepMessage, soft_s: float, hard_s: float, *, amqp: bool = False, dispatched: bool = False
) -> dict[str, Any]:
    """The arguments of `send_task` for this step: its queue, priority (see `priority`) and
    time limits, and the headers' `argsrepr` and `kwargsrepr` where `repr` makes them (see
    `_argument_texts`)."""
    kwargs = msg.as_kwargs()
    return {
        "kwargs": kwargs,
        **_argument_texts(kwargs),
        "queue": msg.queue,
        "priority": priority(msg, amqp=amqp, dispatched=dispatched),
        "soft_time_limit": math.ceil(soft_s),
        "time_limit": math.ceil(hard_s),
    }
