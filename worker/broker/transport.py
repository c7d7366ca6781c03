"""kombu's Redis transport, guarded: an entry on a queue that is not JSON or not a well-formed
envelope (properties, delivery tag, body that decodes) is dead-lettered (deadletters.py) where
BRPOP hands it over, before kombu builds a message from it, instead of raising out of the
worker's event loop. kombu decodes each entry in the worker's main process, and by default such
an entry makes the worker exit ("Unrecoverable error"), and one already recorded as unacked
goes back on the queue for the next worker to die on.

`Transport` is the app's `broker_transport` on Redis (worker/broker/app.py), for a worker and a
client's producer alike (its channels keep one client per pool for every publish and ack). This
module loads kombu, never Celery's worker side: the consumer's guards are intake.py's.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from queue import Empty
from typing import Any

from kombu.transport import redis as kombu_redis
from kombu.utils.encoding import bytes_to_str
from kombu.utils.json import loads as kombu_loads

from turnstile.worker.broker.deadletters import Reason, make, record


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
    where BRPOP hands it over, instead of raising out of the worker's event loop."""

    # set by kombu's Channel at run time
    connection_errors: tuple[type[BaseException], ...]
    _queue_cycle: Any
    _flush_brpop_reauth: Callable[[], None]
    _create_client: Callable[[], Any]

    def _brpop_read(self, **options: Any) -> bool:
        # kombu's own `_brpop_read` (kombu 5.7), with the decode and the hand-over checked.
        try:
            try:
                dest__item = self.client.parse_response(self.client.connection, "BRPOP", **options)
            except self.connection_errors:
                self.client.connection.disconnect()
                raise
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
            record(client, make(queue, reason, detail, item))

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
