"""Publishing step messages: the private producer a client sends through, and the sends of a
worker's own app.

A service that imports the client keeps its own `celery.current_app`: the client sends through
`producer()`, an app of its own that is never made current. Nothing here imports Celery until
a step is published (app.py's `make_app` is imported then), so importing the client loads
neither Celery nor kombu's transports; and publishing loads neither Celery's worker side nor
anything of worker/runtime/ (tests/integration/test_import_effects.py).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING

from turnstile.worker.broker import amqp
from turnstile.worker.broker.message import STEP_TASK, StepMessage, publish_options
from turnstile.worker.settings import Settings

if TYPE_CHECKING:
    from celery import Celery

Send = Callable[[StepMessage, float, float], None]

# A client's publish is bounded: a broker that is down or unreachable makes a submission or a
# decision say "accepted, sent later" within a few seconds (the sweeper sends the step),
# instead of hanging on the operating system's connect timeout.
PUBLISH_CONNECT_TIMEOUT_S = 1.0
PUBLISH_RETRY_POLICY = {"max_retries": 2, "interval_start": 0, "interval_step": 0.25,
                        "interval_max": 0.5}  # fmt: skip


@functools.lru_cache(maxsize=8)
def producer(config: Settings) -> Celery:
    """A producer-only app for this configuration's broker (no tasks of its own; it sends by
    task name), one per Settings value: clients built from equal Settings share it and its
    connection pool."""
    from turnstile.worker.broker.app import make_app  # noqa: PLC0415 - Celery at first send

    made = make_app(config)
    timeouts = (  # py-amqp's socket timeouts, or the Redis client's
        {"read_timeout": 5.0, "write_timeout": 5.0}
        if amqp.is_amqp(config.broker)
        else {"socket_connect_timeout": PUBLISH_CONNECT_TIMEOUT_S, "socket_timeout": 5.0}
    )
    made.conf.update(
        broker_connection_timeout=PUBLISH_CONNECT_TIMEOUT_S,
        broker_transport_options={**made.conf.broker_transport_options, **timeouts},
        task_publish_retry_policy=PUBLISH_RETRY_POLICY,
    )
    return made


def sender(config: Settings) -> Send:
    """A function that sends step messages to this configuration's broker, for a client (a
    service, the CLI, the HTTP API, a test); its producer is built at the first send."""

    def send(msg: StepMessage, soft_s: float, hard_s: float) -> None:
        send_step(producer(config), msg, soft_s, hard_s)

    return send


def _on_amqp(app: Celery) -> bool:
    return amqp.is_amqp(app.conf.broker_url)


def send_step(app: Celery, msg: StepMessage, soft_s: float, hard_s: float) -> None:
    app.send_task(STEP_TASK, **publish_options(msg, soft_s, hard_s, amqp=_on_amqp(app)))


def send_steps(app: Celery, batch: list[tuple[StepMessage, float, float]]) -> None:
    """Send the steps the fair-share dispatcher took, in its order, on one producer, batched:
    kombu's Redis transport writes a batch in one pipeline, one round trip for all (RabbitMQ
    publishes them in turn, each confirmed). A queue is declared with its first step only:
    kombu's check of its cache of declared queues copies and binds the queue each time, a third
    of a send (tests/bench/bench_send_steps.py), and the rest go on the same channel."""
    on_amqp = _on_amqp(app)
    declared: set[str] = set()
    with app.producer_or_acquire() as producer, producer.batch():
        for msg, soft_s, hard_s in batch:
            options = publish_options(msg, soft_s, hard_s, amqp=on_amqp, dispatched=True)
            if msg.queue in declared:
                options["declare"] = []  # not None: Celery would declare the queue again
            declared.add(msg.queue)
            app.send_task(STEP_TASK, producer=producer, **options)
