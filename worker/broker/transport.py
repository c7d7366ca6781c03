"""kombu's Redis transport, guarded: an entry on a queue that is not JSON or not a well-formed
envelope (properties, delivery tag, body that decodes) is dead-lettered (deadletters.py) where a
read hands it over (a take, or a BRPOP), before kombu builds a message from it, instead of
raising out of the worker's event loop. kombu decodes each entry in the worker's main process,
and by default such an entry makes the worker exit ("Unrecoverable error"), and one already
recorded as unacked goes back on the queue for the next worker to die on. And a queue whose list
the server refuses to pop (a key of another type where it should be: WRONGTYPE) is left out of
the worker's reads, said once in the log (`queue_broken`), and looked at again every
BROKEN_RECHECK_S, while the worker goes on reading its other queues (kombu would raise out of
the event loop, and the worker, and every worker restarted on that queue, would exit).

And a worker on the green pool takes a message as soon as a slot frees. Its consumer is Celery's
`synloop`, which calls `drain_events(timeout=2.0)`; kombu's poller stops reading the queues
while the channel's prefetch credit is used up, and nothing then woke the wait when a turn's ack
gave the credit back: the worker sat with free slots for up to 2 s (issue 36). `Poller` wakes
that wait on the ack (a byte down a pipe it also polls), and the consumer reads again at once.
And it reads as many messages at once as its credit allows (`Channel`, broker_take.lua), each
recorded unacked in the same step.

`Transport` is the app's `broker_transport` on Redis (worker/broker/app.py), for a worker and a
client's producer alike (its channels keep one client per pool for every publish and ack). This
module loads kombu, never Celery's worker side: the consumer's guards are intake.py's.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from functools import cache, cached_property
from queue import Empty
from typing import Any, cast

import redis
import structlog
from kombu.transport import redis as kombu_redis
from kombu.transport import virtual
from kombu.utils import eventio
from kombu.utils.encoding import bytes_to_str
from kombu.utils.json import loads as kombu_loads
from redis.commands.core import Script

from turnstile.worker.broker.deadletters import Reason, make, record
from turnstile.worker.broker.layout import turnstile_queue
from turnstile.worker.store import scripts

log = structlog.get_logger("turnstile.intake")

# How often a worker looks again at a queue it left out as broken (a few TYPE reads).
BROKEN_RECHECK_S = 5.0
# The most messages one take (broker_take.lua) hands the consumer, within its prefetch credit: a
# take's messages are handed to Celery one after another before the consumer reads again. Per
# message handed over and acked, 8 cost 73 us of CPU, 16 70, 32 68, 64 and 128 66-67 (the ack's
# round trip is most of it; tests/bench/bench_take.py): larger takes gain nothing more.
TAKE_MOST = 32


@cache
def take_script() -> tuple[str, str]:
    """The take's text (store/lua/broker_take.lua) and its sha, made once per process."""
    body = scripts.source("broker_take")
    return body, hashlib.sha1(body.encode(), usedforsecurity=False).hexdigest()


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


_eventio: Any = eventio  # its pollers are private: untyped here


class _GreenPoll(_eventio._poll):  # type: ignore[misc]
    """kombu's poll(2) poller, over gevent's cooperative `select.poll`, for a green worker.

    Under a green pool kombu polls with select(2), which takes no descriptor numbered 1,024 or
    more: ValueError, and the worker stops ("Unrecoverable error"). A green worker holds a
    socket or two per turn in flight, so with hundreds of turns the wake pipe, or a broker
    connection made again after an error, is numbered past it. gevent's poll waits on the hub
    like its select and takes any descriptor. A descriptor no longer registered (a closed
    socket's) is left alone on unregister, as kombu's select poller does."""

    def unregister(self, fd: Any) -> Any:
        with suppress(KeyError, ValueError):
            return super().unregister(fd)
        return fd


def _green_poll() -> bool:
    """Whether kombu took a cooperative `select.poll` (gevent's, or the green worker's own, see
    worker/runtime/pools.py): the process was patched by gevent before kombu loaded."""
    if "gevent.monkey" not in sys.modules:
        return False
    from gevent import monkey  # noqa: PLC0415 - only a green worker loads gevent

    poll = getattr(_eventio, "xpoll", None)
    return (
        poll is not None
        and monkey.is_module_patched("select")
        and poll is not monkey.get_original("select", "poll")
    )


class Poller(kombu_redis.MultiChannelPoller):
    """kombu's poller of a transport's channels, whose wait is woken when an ack gives a
    channel its prefetch credit back.

    With the credit used up, kombu leaves the channel's BRPOP out of the wait (or sleeps when
    nothing else is polled), and a consumer without an event loop (Celery's `synloop`, the green
    pool's) waited out its whole timeout with slots free. While a channel has no credit, the
    wait here also polls a pipe that `wake` writes to; the poll returns, and the next one sends
    the BRPOP again. A consumer with an event loop (prefork's `asynloop`) never waits here: its
    hub runs `on_poll_start` on every tick, and the pool's replies are ticks."""

    # The pipe, made at the first wait without credit (a producer's transport never has one).
    _wake: tuple[int, int] | None = None
    _waiting = False

    _channels: set[Any]
    _fd_to_chan: dict[int, Any]
    _paused_brpop: dict[int, Any]
    poller: Any

    def __init__(self) -> None:
        super().__init__()
        if isinstance(self.poller, _eventio._select) and _green_poll():
            self.poller = _GreenPoll()

    def _starved(self) -> bool:
        return any(c.active_queues and not c.qos.can_consume() for c in self._channels)

    def wake(self) -> None:
        """A slot freed: end a wait that no message would end (from any greenlet or thread)."""
        if self._waiting and self._wake is not None:
            with suppress(OSError):  # a full pipe already wakes the wait
                os.write(self._wake[1], b"\0")

    @property
    def fds(self) -> dict[int, Any]:
        fds: dict[int, Any] = {fd: chan for fd, chan in self._fd_to_chan.items()
                               if fd not in self._paused_brpop}  # fmt: skip
        if self._waiting and self._wake is not None:
            fds[self._wake[0]] = None  # not an empty set: kombu polls instead of sleeping
        return fds

    def get(self, callback: Any, timeout: float | None = None) -> None:
        if not self._starved():
            cast(Any, super()).get(callback, timeout)
            return
        if self._wake is None:
            self._wake = os.pipe()
            for fd in self._wake:
                os.set_blocking(fd, False)
            self.poller.register(self._wake[0], self.eventflags)
        self._waiting = True
        try:
            cast(Any, super()).get(callback, timeout)
        finally:
            self._waiting = False
            with suppress(OSError):
                while os.read(self._wake[0], 512):
                    pass

    def handle_event(self, fileno: int, event: int) -> Any:
        if self._wake is not None and fileno == self._wake[0]:
            return None  # the pipe is drained after the wait
        return super().handle_event(fileno, event)

    def close(self) -> None:
        super().close()
        if self._wake is not None:
            with suppress(KeyError, ValueError, OSError):
                self.poller.unregister(self._wake[0])
            for fd in self._wake:
                os.close(fd)
            self._wake = None


class QoS(kombu_redis.QoS):
    """kombu's Redis QoS (its unacked records), which does not record again a message a take
    (broker_take.lua) recorded already: kombu's record is a MULTI, a round trip per message."""

    channel: Channel
    # With Celery's `worker_disable_prefetch`, the worker's free slots (set by its consumer,
    # intake.py): Celery's patch of `can_consume` reads while one slot is free, and does not
    # reach the estimate a take is sized by, so a take could exceed them; it takes no more.
    free_slots: Callable[[], int] | None = None

    def can_consume_max_estimate(self) -> int | None:  # type: ignore[override]  # kombu's: None
        credit: int | None = super().can_consume_max_estimate()
        if self.free_slots is None:
            return credit
        free = max(self.free_slots(), 0)
        return free if credit is None else min(credit, free)

    def append(self, message: Any, delivery_tag: str) -> None:
        if delivery_tag and delivery_tag == self.channel._turnstile_recorded:
            virtual.QoS.append(self, message, delivery_tag)
            return
        super().append(message, delivery_tag)

    def ack(self, delivery_tag: str) -> None:
        if not self._forget(delivery_tag):
            super().ack(delivery_tag)
            return
        virtual.QoS.ack(self, delivery_tag)

    def reject(self, delivery_tag: str, requeue: bool = False) -> None:
        if requeue or not self._forget(delivery_tag):
            super().reject(delivery_tag, requeue)
            return
        virtual.QoS.ack(self, delivery_tag)  # kombu's reject ends the same way

    def _forget(self, delivery_tag: str) -> bool:
        """Remove the message's unacked record in one script call (broker_ack.lua) where
        kombu's ack sends a MULTI of two commands (redis-py's transaction costs about 1.5x the
        script's client CPU; the ack was 5% of a green worker's); False where the channel keeps
        kombu's way (a global key prefix, which kombu's client adds to its commands' keys and
        not to a script's)."""
        channel = self.channel
        if channel.global_keyprefix:
            return False
        with channel.conn_or_acquire() as client:
            scripts.call_script(
                client, channel.ack_script, [self.unacked_index_key, self.unacked_key],
                [delivery_tag],
            )  # fmt: skip
        return True


class Channel(kombu_redis.Channel):
    """kombu's Redis channel, except that an entry which is not an envelope is dead-lettered
    where it is read, and a queue whose lists the server refuses to pop is left out of the
    reads, instead of either raising out of the worker's event loop.

    And its reads take several messages at once where kombu's take one: a take (one call of
    broker_take.lua) pops up to the prefetch credit's worth (TAKE_MOST at most) and records
    each as unacked as kombu's QoS does, in the same step, so a worker killed after it leaves
    them for kombu's restore; kombu's BRPOP pops one, and its QoS records it in a MULTI after. The
    consumer then waited a round trip per message for the BRPOP and another for the record,
    through a hub busy with the turns (issue 36: 45-60 messages a second in all with steps
    waiting on the list). When a take finds the lists empty, the next read is kombu's BRPOP,
    which waits for a message (a script cannot block); after it, the reads take again."""

    QoS = QoS

    @cached_property
    def ack_script(self) -> Script:
        """broker_ack.lua, registered with a client of the channel's pool, which serves its
        acks (not `self.client`, whose connection may be waiting in a BRPOP)."""
        return cast(Script, self._create_client().register_script(scripts.source("broker_ack")))

    # the lists of the take in flight (None: a BRPOP, or nothing, in flight)
    _turnstile_taking: list[str] | None = None
    _turnstile_wait = False  # the last take found the lists empty: wait on BRPOP
    _turnstile_no_take = False  # the server refused a take (not a queue's list): BRPOP only
    _turnstile_recorded = ""  # the delivery tag of the message being handed over, if taken

    # set by kombu's Channel at run time
    connection_errors: tuple[type[BaseException], ...]
    ack_emulation: bool
    global_keyprefix: str
    unacked_key: str
    unacked_index_key: str
    qos: Any
    _queue_cycle: Any
    _flush_brpop_reauth: Callable[[], None]
    _create_client: Callable[[], Any]
    brpop_timeout: int
    priority_steps: list[int]
    _q_for_pri: Callable[[str, int], str]

    def basic_ack(self, delivery_tag: str, multiple: bool = False) -> None:
        super().basic_ack(delivery_tag, multiple)
        self._wake_poller()

    def basic_reject(self, delivery_tag: str, requeue: bool = False) -> None:
        super().basic_reject(delivery_tag, requeue)
        self._wake_poller()

    def _wake_poller(self) -> None:
        cycle = getattr(self.connection, "cycle", None)
        if isinstance(cycle, Poller):
            cycle.wake()

    def _brpop_start(self, timeout: int | None = None) -> None:
        # kombu's own `_brpop_start` (kombu 5.7), without the queues left out as broken, and a
        # take (broker_take.lua) in place of the BRPOP unless the last take found none.
        left_out = self._left_out()
        taking = not self._turnstile_wait and self._can_take()
        if not left_out and not taking:
            cast(Any, super())._brpop_start(timeout)
            return
        queues = [q for q in self._queue_cycle.consume(len(self.active_queues))
                  if q not in left_out]  # fmt: skip
        if not queues:
            return  # every queue is broken: the next poll looks again
        lists = [self._q_for_pri(queue, pri) for pri in self.priority_steps for queue in queues]
        self._in_poll = self.client.connection
        self._brpop_sent_at = time.monotonic()
        if taking:
            self._turnstile_taking = lists
            self.client.connection.send_command(*self._take_command(lists))
            return
        wait = self.brpop_timeout if timeout is None else timeout
        self.client.connection.send_command("BRPOP", *lists, wait or 0)

    def _can_take(self) -> bool:
        """Whether the channel's reads may be takes: kombu's unacked records on (its Redis
        QoS) and no global key prefix (which kombu's BRPOP adds and a take does not)."""
        return (
            self.ack_emulation
            and not self.global_keyprefix
            and not self._turnstile_no_take
            and isinstance(self.qos, QoS)
        )

    def _take_command(self, lists: list[str]) -> list[Any]:
        """The take of as many messages as the prefetch credit allows (TAKE_MOST at most)."""
        credit = self.qos.can_consume_max_estimate()  # None: no prefetch limit
        most = TAKE_MOST if credit is None else max(1, min(credit, TAKE_MOST))
        _, sha = take_script()
        return ["EVALSHA", sha, 2 + len(lists), self.unacked_key, self.unacked_index_key,
                *lists, most, repr(time.time())]  # fmt: skip

    def _brpop_read(self, **options: Any) -> bool:
        # kombu's own `_brpop_read` (kombu 5.7), with the decode and the hand-over checked,
        # and an error reply (WRONGTYPE) taken as a broken queue; or a take's reply.
        try:
            lists = self._turnstile_taking
            if lists is not None:
                return self._take_read(lists, **options)
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
            self._turnstile_wait = False  # a message came: take again
            self._hand_over(dest, item)
            return True
        finally:
            self._in_poll = None
            self._turnstile_taking = None
            self._flush_brpop_reauth()

    def _take_read(self, lists: list[str], **options: Any) -> bool:
        """Hand over what a take took (each already recorded unacked), in the order taken;
        none taken: the next read waits on BRPOP. A list the server refused is left out, as
        after a BRPOP."""
        try:
            reply = self.client.parse_response(self.client.connection, "EVALSHA", **options)
        except self.connection_errors:
            self.client.connection.disconnect()
            raise
        except redis.exceptions.NoScriptError:
            self._load_take()
            raise Empty() from None
        error, refused, *flat = reply
        keys = [self.unacked_key, self.unacked_index_key, *lists]  # as broker_take.lua numbers them
        taken = [(keys[int(flat[n]) - 1], flat[n + 1], bytes_to_str(flat[n + 2]))
                 for n in range(0, len(flat), 3)]  # fmt: skip
        self._turnstile_wait = not taken and not error
        self._hand_over_taken(taken)
        if error:
            self._refused(bytes_to_str(error), keys[int(refused) - 1])
        if not taken:
            raise Empty()
        return True

    def _load_take(self) -> None:
        """Load broker_take.lua on the broker (a new server, or one restarted or flushed); a
        server that refuses it (older than Redis 7: no shebang line, no RPOP count) has the
        channel read with kombu's BRPOP."""
        try:
            with self.conn_or_acquire() as client:
                client.script_load(take_script()[0])
        except redis.ResponseError as exc:
            self._refused(str(exc), "broker_take.lua")

    def _hand_over_taken(self, taken: list[tuple[str, bytes, str]]) -> None:
        """Hand each taken message to the consumer; if one raises (the broker went away, the
        worker stops), the ones not handed over yet go back to their lists."""
        for n, (name, item, tag) in enumerate(taken):
            dest = bytes_to_str(name).rsplit(self.sep, 1)[0]
            self._queue_cycle.rotate(dest)
            try:
                self._hand_over(dest, item, tag)
            except BaseException:
                self._give_back(taken[n + 1 :])
                raise

    def _give_back(self, taken: list[tuple[str, bytes, str]]) -> None:
        """Put taken messages back at the tail of their lists (the next to be read, in the
        order taken) and drop their unacked records, in one transaction; if that fails, the
        records stay and kombu restores them after the visibility timeout."""
        if not taken:
            return
        with suppress(*self.connection_errors), self.conn_or_acquire() as client:
            pipe = client.pipeline()
            for name, item, tag in reversed(taken):
                pipe.rpush(name, item)
                if tag:
                    self.qos._remove_from_indices(tag, pipe)
            pipe.execute()

    def _refused(self, error: str, name: str) -> None:
        """A take's list the server refused: its queue left out when its list is broken;
        another refusal (not a queue's) turns the channel's takes off, said once, and its
        reads are kombu's BRPOP again."""
        if self._leave_out_broken(error):
            return
        self._turnstile_no_take = True
        log.error("take_refused", by="consumer", list=name, error=error)

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

    def _hand_over(self, queue: str, item: bytes, tag: str = "") -> None:
        """Deliver an entry taken off `queue`, or dead-letter it; `tag`: the delivery tag a
        take recorded it unacked under ("" after a BRPOP: kombu's QoS records it)."""
        try:
            payload = kombu_loads(bytes_to_str(item))  # as kombu decodes it
        except (TypeError, ValueError) as exc:
            self._dead_letter(queue, Reason.NOT_JSON, str(exc), item, tag)
            return
        problem = envelope_problem(payload)
        if problem is not None:
            self._dead_letter(queue, Reason.BAD_ENVELOPE, problem, item, tag)
            return
        self._turnstile_recorded = tag
        try:
            self.connection._deliver(payload, queue)
        finally:
            self._turnstile_recorded = ""

    def _dead_letter(self, queue: str, reason: Reason, detail: str, item: bytes, tag: str) -> None:
        """Keep the entry as a dead letter, then drop the unacked record a take made of it (a
        worker killed between the two restores it later and dead-letters it again)."""
        with self.conn_or_acquire() as client:
            record(client, make(turnstile_queue(queue), reason, detail, item))
            if tag:
                self.qos._remove_from_indices(tag, client.pipeline()).execute()

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

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.cycle = Poller()  # as kombu's, one for all the channels

    @property
    def client(self) -> Any:
        return self._client

    @client.setter
    def client(self, value: Any) -> None:
        if value is not None or not hasattr(self, "_client"):
            self._client = value
