"""The Celery app's configuration, for both apps Turnstile makes: a worker's
(worker/runtime/app.py adds its step task, its hooks and a pool's bound on broker connections)
and a client's private producer (producer.py), which publishes by task name.

Nothing here loads Celery's worker side: the guarded transport (transport.py, kombu's Redis
transport's subclass, which a producer loads too) and the guarded consumer (intake.py, Celery's
consumer's, which only a worker loads) are named by their import paths; and a producer's app is
made without Celery's fix-ups (its Django fix-up imports `celery.worker` and,
where DJANGO_SETTINGS_MODULE is set, connects worker signals in the service's process). This
module imports Celery itself, so producer.py imports it at the first send.
"""

from __future__ import annotations

from typing import Any

from celery import Celery

from turnstile.worker.broker import amqp, namespace
from turnstile.worker.settings import Settings

# The app's setting that names the store's URL, where the consumer keeps the dead letters of a
# broker that is not Redis (kombu's Redis transport keeps them on the broker's server).
DEAD_LETTER_STORE = "turnstile_dead_letter_store"
# What an app loads, by name: the guarded consumer on every broker (a worker's), the guarded
# transport on Redis (a worker's and a producer's).
CONSUMER = "turnstile.worker.broker.intake:Consumer"
REDIS_TRANSPORT = "turnstile.worker.broker.transport:Transport"
# Broker connections a process keeps when nothing asks for more: a client publishes one
# message at a time per thread, and a prefork worker process runs one turn at a time.
DEFAULT_POOL_LIMIT = 4
KOMBU_CHANNEL_CONNECTIONS = 10  # kombu's Redis channel's default `max_connections`


def make_app(
    config: Settings, *, main: bool = False, pool_limit: int = DEFAULT_POOL_LIMIT
) -> Celery:
    """A Celery app configured from `config`, with no task of its own: a worker's (`main`:
    made the current app, with Celery's fix-ups) or a client's private producer (never made
    current, no fix-ups). `pool_limit` bounds the broker connections the process keeps."""
    # Its queue table names every Turnstile queue by its broker name (namespace.py).
    celery = Celery(
        "turnstile", set_as_current=main, fixups=None if main else [], amqp=namespace.AMQP
    )
    url = config.broker if (config.broker_url or config.redis_url) else None
    transport = (
        transport_options(url or "")
        if amqp.is_amqp(url)
        else {
            "visibility_timeout": config.visibility_timeout_s,
            # Each Redis channel's own client pool (acks, publishes): kombu's default of 10
            # made a green worker's eleventh ack at once fail ("Too many connections"), and
            # Celery then restarted its consumer and took the unacked steps back.
            "max_connections": max(pool_limit, KOMBU_CHANNEL_CONNECTIONS),
        }
    )
    celery.conf.update(
        broker_url=url,
        broker_transport_options=transport,
        broker_connection_retry_on_startup=True,
        task_serializer="json",
        accept_content=["json"],
        result_serializer="json",
        result_backend=None,
        # The disabled backend keeps nothing, so one serves every thread: without this, Celery
        # builds one per thread, which on a green worker is one per task (3% of its CPU).
        result_backend_thread_safe=True,
        task_ignore_result=True,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_create_missing_queues=True,
        worker_send_task_events=config.task_events,
        task_send_sent_event=config.task_events,
        worker_hijack_root_logger=False,
        worker_redirect_stdouts=False,  # structlog writes its own lines to stderr
        broker_pool_limit=pool_limit,
        # A queue entry the worker cannot take in goes to the dead letters, not the worker
        # down; on RabbitMQ, quorum queues and publisher confirms (worker/broker/amqp.py).
        **celery_config(url or "", config.redis_url),
        **namespace.celery_config(config.default_queue),
    )
    return celery


def celery_config(broker_url: str, store_url: str | None = None) -> dict[str, Any]:
    """The Celery settings that put the guards in place: the consumer (intake.py) on every
    broker, the guarded transport (transport.py) on Redis; on RabbitMQ the quorum queues and
    their settings (amqp.py), and the store the consumer keeps its dead letters in
    (`store_url`). Transport options are returned apart (`transport_options`), for the app to
    merge with its own."""
    config: dict[str, Any] = {"worker_consumer": CONSUMER}
    if broker_url.startswith(("redis://", "rediss://")):
        config["broker_transport"] = REDIS_TRANSPORT
    elif amqp.is_amqp(broker_url):
        config |= amqp.celery_config()
        config[DEAD_LETTER_STORE] = store_url
    return config


def transport_options(broker_url: str) -> dict[str, Any]:
    """kombu's transport options for this broker, besides the app's own."""
    return amqp.transport_options() if amqp.is_amqp(broker_url) else {}
