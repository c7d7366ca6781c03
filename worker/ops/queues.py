"""What an operator sees of the queues: depth on the broker, turns in flight, running and
parked runs, flags, dead letters and each tenant's fair share; a queue's backlog, the figure
an autoscaler reads; and `drain --wait`'s wait.

A broken queue (a key of another type where one of its lists or sets is, worker/store/
queues.py) is shown with what was refused (`broken`) and the figures that could be read; it
never fails the view of the others."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any, TypeVar

import redis

from turnstile.worker.broker.layout import broker_depth, dead_letter_count
from turnstile.worker.client._client import Client
from turnstile.worker.ops.errors import DrainTimeoutError, QueueBrokenError
from turnstile.worker.ops.subjects import (
    SCAN_COUNT,
    StoredQueue,
    Subject,
    check_known,
    live_inflight,
    parked_runs,
    runs_in,
)
from turnstile.worker.scheduling import fair
from turnstile.worker.store import controls
from turnstile.worker.store import pending as pending_sets
from turnstile.worker.store import queues as served_queues
from turnstile.worker.store.values import server_ms

DRAIN_POLL_S = 0.2
T = TypeVar("T")


@dataclass(frozen=True)
class QueueView:
    name: str
    depth: int | None  # messages waiting on the broker
    in_flight: int  # turns running now
    running: int  # live runs on the queue that are not parked (queued or in flight)
    parked: int
    paused: str  # when it was paused, "" when it is not
    paused_by: str
    draining: str
    draining_by: str
    dead_letters: int | None = None  # entries workers could not take in
    # Fair share: per tenant with steps waiting for the dispatcher on this queue or turns in
    # flight, {tenant, waiting (on this queue), in_flight (every queue), cap, weight}.
    tenants: list[dict[str, Any]] = field(default_factory=list)
    # "" for a queue that works; else what the server refused when it was read (or what the
    # dispatcher last met on it): the queue is skipped until its keys are mended.
    broken: str = ""

    @property
    def pending(self) -> int:
        """Steps waiting in the tenants' pending lists for the dispatcher."""
        return sum(int(t["waiting"]) for t in self.tenants)


def queue_view(c: Client, queue: str) -> QueueView:
    subject = Subject(queue=queue)
    check_known(c, subject)
    return _view(c, subject, served_queues.broken(c.client).get(queue, ""))


class _Reads:
    """Each read of a view, guarded: an error reply (the queue's key is of another type) gives
    the read's default and is kept, the first one, as what is broken."""

    def __init__(self) -> None:
        self.error = ""

    def __call__(self, read: Callable[[], T], default: T) -> T:
        try:
            return read()
        except redis.ResponseError as exc:
            self.error = self.error or str(exc)
            return default


def _view(c: Client, subject: Subject, recorded: str) -> QueueView:
    """The queue's view, each figure read on its own: a broken one is left unknown (None or
    0) and the queue shown broken, with what was refused or what the dispatcher recorded."""
    queue, reads = subject.name, _Reads()
    flags = reads(lambda: controls.queue_flags(c.client, queue), ("", "", "", ""))
    paused, paused_by, draining, draining_by = flags
    view = QueueView(
        queue,
        reads(lambda: broker_depth(c.config.broker, queue), None),
        reads(lambda: len(live_inflight(c, subject)), 0),
        reads(lambda: len(runs_in(c, subject, "running")), 0),
        reads(lambda: len(parked_runs(c, subject)), 0),
        paused, paused_by, draining, draining_by,
        reads(lambda: dead_letter_count(c.config.broker, queue, c.client), None),
        reads(lambda: _fair_tenants(c, queue, reads), []),
    )  # fmt: skip
    return replace(view, broken=reads.error or recorded)


def _fair_tenants(c: Client, queue: str, reads: _Reads) -> list[dict[str, Any]]:
    out = []
    for tenant in pending_sets.active_tenants(c.client, queue):
        view = fair.tenant_view(c.client, tenant, [queue])
        if view.broken:  # read again, for the error the server gives
            none: dict[str, int] = {}
            reads(lambda: fair.pending_counts(c.client, [tenant], queue), none)  # noqa: B023
        if view.waiting or view.in_flight:
            out.append(asdict(view))
    return out


@dataclass(frozen=True)
class Backlog:
    """The steps of a queue waiting or running: what its workers have to do, as an autoscaler
    reads it (`waiting + in_flight` over the turns one worker holds)."""

    queue: str
    pending: int  # in the tenants' pending lists (fair share), for the dispatcher
    on_broker: int  # sent to the broker and not taken by a worker yet
    waiting: int  # pending + on_broker
    in_flight: int  # turns running now
    backlog: int  # waiting + in_flight


def backlog(c: Client, queue: str) -> Backlog:
    """The queue's backlog, exact and cheap: the pending lists of the tenants in the queue's
    active set (the dispatcher's; a tenant with a step pending is in it), a round trip per
    slice of them; the broker's lists; and the tenants' turns in flight, a round trip per slice
    of tenants. No key is scanned for. On a broker that is not Redis, `on_broker` is what the
    store records as sent by the dispatcher and not loaded yet (keys.fair_sent)."""
    check_known(c, Subject(queue=queue))
    try:
        return _backlog(c, queue)
    except redis.ResponseError as exc:
        raise QueueBrokenError(f"queue {queue!r} is broken: {exc}") from None


def _backlog(c: Client, queue: str) -> Backlog:
    # A tenant may be seen twice in the scan of the queue's active set.
    active = sorted({t for some in pending_sets.scan_active(c.client, queue) for t in some})
    pending = 0
    for start in range(0, len(active), SCAN_COUNT):
        some = active[start : start + SCAN_COUNT]
        pending += sum(fair.pending_counts(c.client, some, queue).values())
    on_broker = broker_depth(c.config.broker, queue)
    if on_broker is None:
        since = server_ms(c.client) - fair.sent_window_ms(c.config)
        on_broker = pending_sets.sent_since(c.client, queue, since)
    in_flight = len(live_inflight(c, Subject(queue=queue)))
    waiting = pending + on_broker
    return Backlog(queue, pending, on_broker, waiting, in_flight, waiting + in_flight)


def queues(c: Client) -> list[QueueView]:
    """Every queue the store holds (used, controlled or served), broken ones included."""
    recorded = served_queues.broken(c.client)
    names = served_queues.names(c.client)
    return [_view(c, StoredQueue(queue=name), recorded.get(name, "")) for name in names]


def wait_drained(
    c: Client, queue: str, *, timeout_s: float | None = None, poll_s: float = DRAIN_POLL_S
) -> QueueView:
    """Return when no turn of the queue is in flight; raise DrainTimeoutError after
    `timeout_s` (None: no limit)."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    subject = Subject(queue=queue)
    check_known(c, subject)
    while True:
        view = queue_view(c, queue)  # the counts returned are the ones the check saw
        left = view.in_flight
        if left == 0:
            return view
        if deadline is not None and time.monotonic() >= deadline:
            raise DrainTimeoutError(
                f"queue {queue!r} still has {left} turn(s) in flight after {timeout_s:g} s; "
                "it stays draining"
            )
        time.sleep(poll_s)
