"""Turnstile's queues in the Celery app's queue table, under their broker names.

Celery looks a queue up by name in one table (`app.amqp.queues`): a worker's `-Q default`, a
`send_task(queue="default")`, the default queue. With `task_create_missing_queues` a name it
does not have is declared as a queue, an exchange and a routing key of that very name. Here
the table looks every name up as its broker name (layout.py `broker_queue`), so the Turnstile
queue `default` is declared, published to and consumed as `turnstile.q.default` on Redis and
on RabbitMQ alike, while every caller (the CLI, `celery -A ... worker -Q default`, the
producer, the deploy files' `TURNSTILE_QUEUES`) keeps the name it knows.

Imported by the Celery app only (worker/runtime/app.py), so importing the client loads no
Celery.
"""

from __future__ import annotations

from typing import Any

from celery.app import amqp as celery_amqp
from kombu.utils.functional import maybe_list

from turnstile.worker.broker.layout import broker_queue


class Queues(celery_amqp.Queues):
    """Celery's queue table, keyed by broker names, read by either name."""

    def __getitem__(self, name: str) -> Any:
        return super().__getitem__(broker_queue(name))

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and super().__contains__(broker_queue(name))

    def deselect(self, exclude: Any) -> None:
        if exclude:
            super().deselect([broker_queue(name) for name in maybe_list(exclude)])


class AMQP(celery_amqp.AMQP):
    """Celery's AMQP part with the table above; the app names it (`Celery(amqp=...)`)."""

    queues_cls = Queues


def celery_config(default_queue: str) -> dict[str, Any]:
    """The app's default queue, its exchange and routing key, by their broker name."""
    name = broker_queue(default_queue)
    return {
        "task_default_queue": name,
        "task_default_exchange": name,
        "task_default_routing_key": name,
    }
