"""What a worker's broker connection does with a queue entry it cannot take in: it goes to the
dead letters (deadletters.py) with the reason, and the worker goes on.

kombu decodes each entry in the worker's main process, and by default an entry that is not its
JSON envelope raises out of the event loop: the worker exits ("Unrecoverable error"), and an
entry that was already recorded as unacked goes back on the queue for the next worker to die
on. Here every such entry is dead-lettered, in two places:

- `Transport` / `Channel`: kombu's Redis transport, except that an entry which is not JSON or
  not a well-formed envelope (properties, delivery tag, body that decodes) is dead-lettered
  where it is read, before kombu builds a message from it (`broker_transport`); and a queue
  whose list the server refuses to pop (a key of another type where it should be: WRONGTYPE)
  is left out of the worker's reads, said once in the log (`queue_broken`), and looked at
  again every BROKEN_RECHECK_S, while the worker goes on reading its other queues (kombu
  would raise out of the event loop, and the worker, and every worker restarted on that
  queue, would exit).
- `Consumer`: Celery's consumer (`worker_consumer`), on every broker (on RabbitMQ it is the
  only guard: py-amqp hands over whatever bytes a message carries, and a body that does not
  decode reaches these handlers; its dead letters are kept in the store), whose handlers
  for a body it cannot decode, a message of no known format, an unknown task and an invalid
  task dead-letter and ack instead of logging and dropping; a message whose headers or body
  would break the strategy or the pool (a time limit that is not two numbers, a body that
  is not `[args, kwargs, embed]`) is caught before it is handed on.
"""

from __future__ import annotations

import base64
import binascii
import json
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime
from queue import Empty
from typing import Any, cast

import redis
import structlog
from celery.worker.consumer import Consumer as CeleryConsumer
from kombu.transport import redis as kombu_redis
from kombu.utils.encoding import bytes_to_str
from kombu.utils.json import loads as kombu_loads

from turnstile.worker.broker import amqp
from turnstile.worker.broker.deadletters import Reason, make, record
from turnstile.worker.broker.layout import turnstile_queue

log = structlog.get_logger("turnstile.intake")

# How often a worker looks again at a queue it left out as broken (a few TYPE reads).
BROKEN_RECHECK_S = 5.0

# The app's setting that names the store's URL, where the consumer keeps the dead letters of a
# broker that is not Redis (kombu's Redis transport keeps them on the broker's server).
DEAD_LETTER_STORE = "turnstile_dead_letter_store"


def _info_ok(props: Mapping[str, Any]) -> bool:
    info = props.get("delivery_info")
    return isinstance(info, Mapping) and all(
        isinstance(info.get(k), str) for k in ("exchange", "routing_key")
    )


# What kombu's virtual Message and the Redis QoS read from an envelope, in the order they read
# it: each check with what to say when it fails.
_ENVELOPE_CHECKS: tuple[tuple[Callable[[Mapping[str, Any], Mapping[str, Any]], bool], str], ...] = (
    (lambda p, props: isinstance(props.get("delivery_tag"), str) and bool(props["delivery_tag"]),
     "no delivery tag"),
    (lambda p, props: _info_ok(props), "delivery_info has no exchange and routing key"),
    (lambda p, props: isinstance(p.get("headers"), Mapping | None), "headers is not an object"),
    (lambda p, props: all(isinstance(p.get(k), str | None)
                          for k in ("content-type", "content-encoding")),
     "content type or encoding is not a string"),
    (lambda p, props: props.get("priority") is None or type(props["priority"]) is int,
     "priority is not an integer"),
)  # fmt: skip


def envelope_problem(payload: Any) -> str | None:
    """Why kombu's virtual transport could not build a message from this decoded entry, or
    None. The same reads as `kombu.transport.virtual.Message` and the Redis QoS make."""
    if not isinstance(payload, Mapping):
        return f"the entry is a JSON {type(payload).__name__}, not an object"
    props = payload.get("properties")
    if not isinstance(props, Mapping):
        return "no properties object"
    for ok, problem in _ENVELOPE_CHECKS:
        if not ok(payload, props):
            return problem
    return _body_problem(payload.get("body"), props.get("body_encoding"))


def _body_problem(body: Any, encoding: Any) -> str | None:
    if not body:
        return None
    if not isinstance(body, str):
        return "body is not a string"
    if encoding == "base64":
        try:
            base64.b64decode(body.encode(), validate=True)
        except (binascii.Error, ValueError) as exc:
            return f"body is not base64: {exc}"
    elif encoding is not None:
        return f"unknown body encoding {encoding!r}"
    return None


class Channel(kombu_redis.Channel):
    """kombu's Redis channel, except that an entry which is not an envelope is dead-lettered
    where BRPOP hands it over, and a queue whose lists the server refuses to pop is left out
    of the reads, instead of either raising out of the worker's event loop."""

    # set by kombu's Channel at run time
    connection_errors: tuple[type[BaseException], ...]
    _queue_cycle: Any
    _flush_brpop_reauth: Callable[[], None]
    _create_client: Callable[[], Any]
    brpop_timeout: int
    priority_steps: list[int]
    _q_for_pri: Callable[[str, int], str]

    def _brpop_start(self, timeout: int | None = None) -> None:
        # kombu's own `_brpop_start` (kombu 5.7), without the queues left out as broken.
        left_out = self._left_out()
        if not left_out:
            cast(Any, super())._brpop_start(timeout)
            return
        queues = [q for q in self._queue_cycle.consume(len(self.active_queues))
                  if q not in left_out]  # fmt: skip
        if not queues:
            return  # every queue is broken: the next poll looks again
        wait = self.brpop_timeout if timeout is None else timeout
        lists = [self._q_for_pri(queue, pri) for pri in self.priority_steps for queue in queues]
        self._in_poll = self.client.connection
        self._brpop_sent_at = time.monotonic()
        self.client.connection.send_command("BRPOP", *lists, wait or 0)

    def _brpop_read(self, **options: Any) -> bool:
        # kombu's own `_brpop_read` (kombu 5.7), with the decode and the hand-over checked,
        # and an error reply (WRONGTYPE) taken as a broken queue.
        try:
            try:
                dest__item = self.client.parse_response(self.client.connection, "BRPOP", **options)
            except self.connection_errors:
                self.client.connection.disconnect()
                raise
            except redis.ResponseError as exc:
                if not self._leave_out_broken(str(exc)):
                    raise
                raise Empty() from None
            if not dest__item:
                raise Empty()
            dest, item = dest__item
            dest = bytes_to_str(dest).rsplit(self.sep, 1)[0]
            self._queue_cycle.rotate(dest)
            self._hand_over(dest, item)
            return True
        finally:
            self._in_poll = None
            self._flush_brpop_reauth()

    def _broken_lists(self, queues: list[str]) -> dict[str, str]:
        """Of these broker queues, the ones a list of which is not a list (or cannot be
        read), with what it is."""
        with self.conn_or_acquire() as client:
            pipe = client.pipeline(transaction=False)
            lists = [(q, self._q_for_pri(q, pri)) for q in queues for pri in self.priority_steps]
            for _, name in lists:
                pipe.type(name)
            found: dict[str, str] = {}
            for (queue, name), kind in zip(lists, pipe.execute(raise_on_error=False), strict=True):
                said = kind if isinstance(kind, Exception) else bytes_to_str(kind)
                if str(said) not in ("list", "none"):
                    found.setdefault(queue, f"{name!r} is {said}, not a list")
            return found

    def _leave_out_broken(self, error: str) -> bool:
        """After BRPOP's error reply: leave out the queues whose lists are broken, each said
        once; False when none is (the error is not one queue's)."""
        found = self._broken_lists(list(self.active_queues))
        left_out = self._broken_queues()
        until = time.monotonic() + BROKEN_RECHECK_S
        for queue, what in found.items():
            if queue not in left_out:
                log.error("queue_broken", by="consumer", queue=turnstile_queue(queue),
                          error=error, found=what)  # fmt: skip
            left_out[queue] = until
        return bool(found)

    def _left_out(self) -> set[str]:
        """The broker queues left out of the reads now: those found broken, looked at again
        once BROKEN_RECHECK_S has passed (and read again when they are mended)."""
        left_out = self._broken_queues()
        now = time.monotonic()
        due = [q for q, until in left_out.items() if until <= now]
        if due:
            still = self._broken_lists(due)
            for queue in due:
                if queue in still:
                    left_out[queue] = now + BROKEN_RECHECK_S
                else:
                    del left_out[queue]
                    log.info("queue_mended", by="consumer", queue=turnstile_queue(queue))
        return set(left_out)

    def _broken_queues(self) -> dict[str, float]:
        left_out: dict[str, float] | None = getattr(self, "_turnstile_broken", None)
        if left_out is None:
            left_out = {}
            self._turnstile_broken = left_out
        return left_out

    def _hand_over(self, queue: str, item: bytes) -> None:
        try:
            payload = kombu_loads(bytes_to_str(item))  # as kombu decodes it
        except (TypeError, ValueError) as exc:
            self._dead_letter(queue, Reason.NOT_JSON, str(exc), item)
            return
        problem = envelope_problem(payload)
        if problem is not None:
            self._dead_letter(queue, Reason.BAD_ENVELOPE, problem, item)
            return
        self.connection._deliver(payload, queue)

    def _dead_letter(self, queue: str, reason: Reason, detail: str, item: bytes) -> None:
        with self.conn_or_acquire() as client:
            record(client, make(turnstile_queue(queue), reason, detail, item))

    @contextmanager
    def conn_or_acquire(self, client: Any = None) -> Iterator[Any]:
        """The client a publish or an ack runs on: kombu builds a new one (over the same pool)
        for every publish and every ack, about 70 us each; one per channel and pool serves
        them all (a client takes a connection from its pool per command, so greenlets and
        threads can share it)."""
        if client:
            yield client
            return
        pool = self.pool
        cached = getattr(self, "_turnstile_client", None)
        if cached is None or cached.connection_pool is not pool:
            cached = self._create_client()
            self._turnstile_client = cached
        yield cached


class Transport(kombu_redis.Transport):
    """The Redis transport with the dead-lettering channel; `broker_transport` names it.

    It also keeps its connection's settings after the connection is released. kombu clears
    `transport.client` when a connection closes, but a channel of that connection can still
    need a new Redis pool afterwards (its unacked messages restored at exit or on a late close,
    a late ack), and building one reads `transport.client.hostname`: an AttributeError out of
    the event loop or an exit hook (kombu #582, #970) instead of the restore.
    """

    Channel = Channel

    @property
    def client(self) -> Any:
        return self._client

    @client.setter
    def client(self, value: Any) -> None:
        if value is not None or not hasattr(self, "_client"):
            self._client = value


# -- the Celery consumer: messages Celery cannot take in ----------------------------------------


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
        (DEAD_LETTER_STORE in the app's settings); one client for the consumer's life."""
        client: redis.Redis | None = getattr(self, "_turnstile_dead_letters", None)
        url = self.app.conf.get(DEAD_LETTER_STORE)
        if client is None and url:
            client = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)
            self._turnstile_dead_letters = client
        return client

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


def celery_config(broker_url: str, store_url: str | None = None) -> dict[str, Any]:
    """The Celery settings that put these in place: the consumer on every broker, the guarded
    transport on Redis; on RabbitMQ the quorum queues and their settings (amqp.py), and the
    store the consumer keeps its dead letters in (`store_url`). Transport options are
    returned apart (`transport_options`), for the app to merge with its own."""
    config: dict[str, Any] = {"worker_consumer": f"{__name__}:Consumer"}
    if broker_url.startswith(("redis://", "rediss://")):
        config["broker_transport"] = f"{__name__}:Transport"
    elif amqp.is_amqp(broker_url):
        config |= amqp.celery_config()
        config[DEAD_LETTER_STORE] = store_url
    return config


def transport_options(broker_url: str) -> dict[str, Any]:
    """kombu's transport options for this broker, besides the app's own."""
    return amqp.transport_options() if amqp.is_amqp(broker_url) else {}
