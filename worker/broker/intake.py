"""What a worker's consumer does with a message it cannot take in: it goes to the dead letters
(deadletters.py) with the reason, and the worker goes on.

`Consumer` is Celery's consumer (`worker_consumer`, worker/broker/app.py), on every broker (on
RabbitMQ it is the only guard: py-amqp hands over whatever bytes a message carries, and a body
that does not decode reaches these handlers; its dead letters are kept in the store): its
handlers for a body it cannot decode, a message of no known format, an unknown task and an
invalid task dead-letter and ack instead of logging and dropping; a message whose headers or
body would break the strategy or the pool (a time limit that is not two numbers, a body that
is not `[args, kwargs, embed]`) is caught before it is handed on. On Redis, an entry that is
not even kombu's envelope is stopped before, by the guarded transport (transport.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

import redis
import structlog
from celery.worker import state as worker_state
from celery.worker.consumer import Consumer as CeleryConsumer
from kombu.transport import redis as kombu_redis

from turnstile.errors import TurnstileError
from turnstile.worker.broker import transport
from turnstile.worker.broker.app import DEAD_LETTER_STORE
from turnstile.worker.broker.deadletters import Reason, make, record
from turnstile.worker.broker.layout import turnstile_queue
from turnstile.worker.store.connect import connect_with_timeout

log = structlog.get_logger("turnstile.deadletters")

# The store's client that keeps RabbitMQ's dead letters: its socket timeouts.
DEAD_LETTER_TIMEOUT_S = 5.0


def _message_raw(message: Any) -> bytes | str:
    raw = getattr(message, "_raw", None)
    if raw is not None:
        try:
            return json.dumps(raw)
        except (TypeError, ValueError):
            return repr(raw)
    body = message.body or b""
    return body if isinstance(body, bytes | str) else repr(body)


def _queue_of(message: Any) -> str:
    """The Turnstile queue the message came from, as its delivery says (by broker name)."""
    info = message.delivery_info or {}
    return turnstile_queue(str(info.get("routing_key") or info.get("exchange") or "?"))


def _time_limit_problem(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, list | tuple) or len(value) != 2:
        return "timelimit is not a pair"
    if not all(v is None or type(v) in (int, float) for v in value):
        return "timelimit holds something other than numbers"
    return None


def _iso_problem(headers: Mapping[str, Any], name: str) -> str | None:
    value = headers.get(name)
    if value is None:
        return None
    try:
        datetime.fromisoformat(value)
    except (TypeError, ValueError):
        return f"{name} is not an ISO time"
    return None


def header_problem(headers: Mapping[str, Any]) -> str | None:
    """Why Celery's strategy or pool would raise on these task fields (protocol-2 headers, or
    a protocol-1 body), or None."""
    if not isinstance(headers.get("id"), str) or not headers["id"]:
        return "no task id"
    for name in ("root_id", "parent_id", "group", "shadow", "origin"):
        if not isinstance(headers.get(name), str | None):
            return f"{name} is not a string"
    retries = headers.get("retries", 0)
    if not isinstance(retries, int) or isinstance(retries, bool) or retries < 0:
        return "retries is not a count"
    return (
        _time_limit_problem(headers.get("timelimit"))
        or _iso_problem(headers, "eta")
        or _iso_problem(headers, "expires")
    )


def _body_args_problem(message: Any) -> str | None:
    try:
        body = message.decode()
    except Exception as exc:  # whatever the serializer raised is the reason
        return f"body does not decode: {exc}"
    if not (
        isinstance(body, list | tuple)
        and len(body) == 3
        and isinstance(body[0], list | tuple)
        and isinstance(body[1], Mapping)
        and isinstance(body[2], Mapping | None)
    ):
        return "body is not [args, kwargs, embed]"
    return None


def protocol2_problem(message: Any) -> tuple[Reason, str] | None:
    """For a message with Celery protocol-2 headers: what in it would break the worker."""
    headers = message.headers
    if not isinstance(headers.get("task"), str):
        return Reason.BAD_HEADERS, "task name is not a string"
    problem = header_problem(headers)
    if problem is not None:
        return Reason.BAD_HEADERS, problem
    problem = _body_args_problem(message)
    return None if problem is None else (Reason.BAD_BODY, problem)


def protocol1_problem(message: Any) -> tuple[Reason, str] | None:
    """For a message in Celery's protocol 1 (the task's fields in the body): what in it would
    break the worker. A body that does not decode, or is no task, is Celery's to report."""
    try:
        body = message.decode()
    except Exception:  # on_decode_error dead-letters it
        return None
    if not isinstance(body, Mapping) or "task" not in body:
        return None  # on_unknown_message dead-letters it
    problem = header_problem(body)
    if problem is not None:
        return Reason.BAD_HEADERS, problem
    if not isinstance(body.get("args", []), list | tuple) or not isinstance(
        body.get("kwargs", {}), Mapping
    ):
        return Reason.BAD_BODY, "args is not a list or kwargs not an object"
    return None


class Consumer(CeleryConsumer):
    """Celery's consumer, with every message it cannot take in dead-lettered and acked."""

    # set by Celery's Consumer at run time
    connection_errors: tuple[type[BaseException], ...]
    channel_errors: tuple[type[BaseException], ...]
    task_consumer: Any
    controller: Any
    pool: Any

    def dead_letter(self, message: Any, reason: Reason, detail: str) -> None:
        letter = make(_queue_of(message), reason, detail, _message_raw(message))
        if isinstance(message.channel, kombu_redis.Channel):
            with message.channel.conn_or_acquire() as client:
                record(client, letter)
        else:  # RabbitMQ: kept in the store (or, with none named, the log line is the record)
            record(self._dead_letter_store(), letter)
        message.ack()

    def _dead_letter_store(self) -> redis.Redis | None:
        """The store's server, where a broker that is not Redis has its dead letters kept
        (DEAD_LETTER_STORE in the app's settings), a single server or a cluster; one client for
        the consumer's life. A store that cannot be reached leaves the log line as the record."""
        client: redis.Redis | None = getattr(self, "_turnstile_dead_letters", None)
        url = self.app.conf.get(DEAD_LETTER_STORE)
        if client is None and url:
            try:
                client = connect_with_timeout(url, DEAD_LETTER_TIMEOUT_S)
            except (redis.RedisError, TurnstileError) as exc:
                log.error("dead_letter_store_unavailable", error=str(exc))
                return None
            self._turnstile_dead_letters = client
        return client

    def loop_args(self) -> tuple[Any, ...]:
        """Celery's, after bounding the takes by the free slots (each time the consumer starts,
        on a new channel)."""
        self._bound_takes()
        args: tuple[Any, ...] = super().loop_args()
        return args

    def _bound_takes(self) -> None:
        """With `worker_disable_prefetch`, a take (transport.py) takes no more messages than the
        pool has free slots, as Celery's patched `can_consume` counts them."""
        if not self.app.conf.worker_disable_prefetch:
            return
        qos = getattr(self.task_consumer.channel, "qos", None)  # py-amqp's channel has none
        if isinstance(qos, transport.QoS):
            qos.free_slots = self._free_slots

    def _free_slots(self) -> int:
        limit = getattr(self.controller, "max_concurrency", None) or self.pool.num_processes
        return int(limit) - len(worker_state.reserved_requests)

    def on_decode_error(self, message: Any, exc: Exception) -> None:
        self.dead_letter(message, Reason.BAD_BODY, f"{type(exc).__name__}: {exc}")

    def on_unknown_message(self, body: Any, message: Any) -> None:
        self.dead_letter(message, Reason.UNKNOWN_FORMAT, "neither Celery protocol 1 nor 2")

    def on_unknown_task(self, body: Any, message: Any, exc: Exception) -> None:
        self.dead_letter(message, Reason.UNKNOWN_TASK, f"no task named {str(exc)[:100]}")

    def on_invalid_task(self, body: Any, message: Any, exc: Exception) -> None:
        self.dead_letter(message, Reason.INVALID_TASK, f"{type(exc).__name__}: {exc}")

    def create_task_handler(self, *args: Any, **kwargs: Any) -> Callable[[Any], Any]:
        handler: Callable[[Any], Any] = super().create_task_handler(*args, **kwargs)
        recoverable = tuple(self.connection_errors) + tuple(self.channel_errors)

        def on_task_received(message: Any) -> Any:
            headers = message.headers
            problem = (
                protocol2_problem(message)
                if isinstance(headers, Mapping) and "task" in headers
                else protocol1_problem(message)
            )
            if problem is not None:
                return self.dead_letter(message, *problem)
            try:
                return handler(message)
            except recoverable:
                raise  # the broker went away: the consumer reconnects, the message is restored
            except Exception as exc:  # one bad message must not stop the worker
                return self.dead_letter(message, Reason.UNHANDLED, f"{type(exc).__name__}: {exc}")

        return on_task_received
