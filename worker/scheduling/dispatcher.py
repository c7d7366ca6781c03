"""The fair-share dispatcher: what moves steps from the tenants' pending lists to the broker.

One dispatcher at a time (a thread in each worker's main process, beside the sweeper; a lock
elects it) keeps each queue's broker list about `dispatch_depth` long (or a DEPTH_SHARE of the
turns its live workers announce they can hold, if more; deeper while the workers empty it
between two passes, see `Depths`), taking steps from the tenants round
robin (`weight` consecutive steps each, a weighted round robin) and skipping a tenant at its
cap on turns in flight or on active runs. A take (pop + slot) is one script (fair_take.lua); a
dispatcher that dies between it and the publish loses that message, and the run's pickup lease
lapses and the sweeper re-sends it, as for any lost message. How steps get into the pending
lists, and the slots and caps, are in fair.py.

A queue whose keys the server refuses (a key of another type where its broker list, a
tenant's pending set or its bookkeeping should be: WRONGTYPE, or any other error reply) is
broken: said once in the log (`queue_broken`), recorded in the store for the operator's views
(worker/store/queues.py), and skipped for BROKEN_RECHECK_S at a time, while every other
queue's dispatch goes on. A pass over it that works again clears it (`queue_mended`). A store
that does not answer is no queue's fault: the pass fails and is tried again, as before.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import redis
import structlog

from turnstile.worker.broker.layout import Depth
from turnstile.worker.broker.message import StepMessage
from turnstile.worker.observability import metrics
from turnstile.worker.scheduling.fair import aging_ms, sent_window_ms, slot_extra_ms, tenant_view
from turnstile.worker.scheduling.ratelimits import Promoter
from turnstile.worker.settings import Settings
from turnstile.worker.store import locks, pending
from turnstile.worker.store import queues as served_queues
from turnstile.worker.store.durability import Durability
from turnstile.worker.store.tenants import weights as read_weights
from turnstile.worker.store.values import server_ms

log = structlog.get_logger("turnstile.fair")

# The dispatcher's sender: a batch of steps, each with its soft and hard time limits, published
# in one round trip where the broker allows it (kombu's publish batch on Redis).
PublishMany = Callable[[list[tuple[StepMessage, float, float]]], None]
LOCK_MS = 3000  # a dispatcher that stops renewing is replaced this long after
CAPACITY_EVERY_S = 2.0  # how often each worker announces the turns it can hold in flight
CAPACITY_TTL_MS = 10_000  # an announcement not renewed this long is a worker gone
# A queue's broker list is kept at least this share of its workers' capacity deep: a pass
# then refills it in batches as large as the turns that end meanwhile, so a green worker's
# hundreds of slots do not wait on passes of a few steps each.
DEPTH_SHARE = 4
# And deeper while its workers drain it between two passes (`Depths`): a pass finds the list
# empty after the pass before filled it, so the workers waited on the dispatcher (whose pass,
# a greenlet of a busy green worker, took 10-70 ms: 16 steps a pass fed 300 a second).
# Held at its ceiling (the workers' capacity), a list's capacity is read again this often.
CEILING_EVERY_S = 0.1
# After a pass, the dispatcher lets the nudges of this long gather before the next: at
# hundreds of commits a second, a pass per nudge would send a step or two for a pass's five
# round trips; this way a pass sends what ended meanwhile, and a step waits at most this more.
# Not with `replica`: its WAIT, after the write, is answered when the server's loop next
# turns, which traffic hastens. `aof` lingers as `none` does since its WAITAOF goes before the
# write and is answered at once (when it went after the write, aof ran at 0.53x of none's
# turns/s with the linger at 2 x 1 zero-latency turns, 0.81x without).
LINGER_S = 0.005
WEIGHTS_EVERY_S = 1.0  # a weight changed by hand applies within this long
GAUGES_EVERY_S = 1.0  # how often the dispatcher publishes each tenant's share as metrics
BROKEN_RECHECK_S = 5.0  # a broken queue is tried again this long after it failed
RECORDS_EVERY_S = 1.0  # how often the store's record of broken queues is read again
PRIORITY = "priority"  # a taken entry's run priority (fair_take.lua's reply), for keys.fair_sent


class RoundRobin:
    """Weighted round robin over the tenants with work: each gets `weight` steps in a row
    (a deficit round robin whose steps all cost one), in name order, then the next one."""

    def __init__(self) -> None:
        self.last: str | None = None
        self.credit = 0

    def pick(self, tenants: list[str], weights: Mapping[str, int]) -> str | None:
        if not tenants:
            return None
        if self.last in tenants and self.credit > 0:
            self.credit -= 1
            return self.last
        after = [t for t in tenants if self.last is None or t > self.last]
        self.last = (after or tenants)[0]
        self.credit = max(1, weights.get(self.last, 1)) - 1
        return self.last

    def skip(self) -> None:
        """The tenant picked could not send (capped, empty): the next pick moves on."""
        self.credit = 0


class Depths:
    """How deep the dispatcher keeps each queue's broker list: its base (`dispatch_depth`, or a
    DEPTH_SHARE of the turns its live workers can hold in flight if more), doubled at a pass
    that finds the list empty though the pass before filled it (every step sent was taken
    before the dispatcher came back: the workers waited on it), up to the turns its live
    workers can hold in flight, and halved back toward the base at a pass that finds more
    than half of it still there; a pass that had less to send than its room (the pending steps
    ran out) sets it back to the base. A step sent to a list that its workers empty between
    two passes waits no longer behind the others than a pass, so a deeper list costs a
    newcomer nothing then. At worst, when the workers stop keeping up just after the list
    grew, a newcomer waits behind up to the workers' capacity of steps (every slot turning
    over once) instead of a DEPTH_SHARE of it, and the list shrinks back from the next pass."""

    def __init__(self) -> None:
        self.wanted: dict[str, int] = {}  # queue -> the depth wanted now
        self.filled: set[str] = set()  # queues whose last pass sent all the room it had

    def room(self, queue: str, base: int, ceiling: int, on_broker: int | None) -> int:
        """The steps to send now to the queue, whose list holds `on_broker` (None: not known,
        the list is then kept at its base as if empty)."""
        if on_broker is None:
            return base
        # Within the ceiling as it is now: workers that left take the depth they made with them.
        wanted = min(ceiling, max(base, self.wanted.get(queue, base)))
        if on_broker == 0 and queue in self.filled:
            wanted = min(ceiling, 2 * wanted)  # the ceiling is never under the base
        elif on_broker > wanted // 2:
            wanted = max(base, wanted // 2)
        self.wanted[queue] = wanted
        return wanted - on_broker

    def sent(self, queue: str, room: int, sent: int) -> None:
        """What the pass over the queue sent of its room."""
        if room > 0 and sent >= room:
            self.filled.add(queue)
            return
        self.filled.discard(queue)
        if room > 0:  # less pending than room: nothing to keep up with
            self.wanted.pop(queue, None)


class Dispatcher:
    """Feeds each queue's broker list from the tenants' pending lists, fairly."""

    def __init__(
        self,
        client: redis.Redis,
        broker_depth: Depth | None,
        config: Settings,
        publish: PublishMany,
    ) -> None:
        self.client, self.broker_depth, self.config = client, broker_depth, config
        self.publish = publish
        self.rr: dict[str, RoundRobin] = {}
        self.token = secrets.token_hex(8)
        self.renewed = 0.0
        self.gauged = 0.0
        self.weights: dict[str, int] = {}
        self.gauge_tenants: set[str] = set()
        # Tenants sent a step since the last gauges: a tenant whose runs then chain (eager
        # continuation) has turns in flight and nothing pending, and is shown all the same.
        self.sent_tenants: set[str] = set()
        self.weights_at = 0.0
        # This worker, as it announces itself: its name, its queues, its turns in flight.
        self.capacity: tuple[str, list[str], int] | None = None
        self.announced = 0.0
        # queue -> (when read, its base depth, its live workers' turns in flight)
        self.depths: dict[str, tuple[float, int, int]] = {}
        self.deeper = Depths()
        self.linger_s = 0.0 if config.durability == Durability.REPLICA else LINGER_S
        self.slot_extra_ms = slot_extra_ms(config)
        self.sent_window_ms = sent_window_ms(config)
        self.aging_ms = aging_ms(config)
        self.taker = pending.Taker(client, slot_extra_ms=self.slot_extra_ms,
                                   aging_ms=self.aging_ms)  # fmt: skip
        # Steps deferred by a provider rate limit (ratelimits.py), queued here when due.
        self.promoter = Promoter(client)
        self.next_due_s: float | None = None
        # Broken queues: queue -> (the error met, when to try it again, monotonic s); and the
        # ones the store records as broken (read at most once a RECORDS_EVERY_S).
        self.broken: dict[str, tuple[str, float]] = {}
        self.recorded: set[str] = set()
        self.recorded_at = 0.0

    def depth(self, queue: str) -> int:
        """Steps waiting on the queue's broker (worker/broker/layout.py: the priority lists'
        lengths on Redis, a passive declare's message count on RabbitMQ); 0 when it is not
        known (the dispatcher then keeps `dispatch_depth` steps moving without reading)."""
        return 0 if self.broker_depth is None else self.broker_depth(queue)

    def leader(self) -> bool:
        """Whether this dispatcher holds the lock (taken or renewed here)."""
        now = time.monotonic()
        if now - self.renewed < LOCK_MS / 3000:
            return True
        held = locks.lead(self.client, locks.DISPATCHER, self.token, LOCK_MS)
        self.renewed = now if held else 0.0
        return held

    def announce(self) -> None:
        """Say how many turns this worker can hold in flight on each of its queues, every
        CAPACITY_EVERY_S; an announcement lapses CAPACITY_TTL_MS after it was made."""
        now = time.monotonic()
        if self.capacity is None or now - self.announced < CAPACITY_EVERY_S:
            return
        name, queues, slots = self.capacity
        lapses = server_ms(self.client) + CAPACITY_TTL_MS
        pending.announce_capacity(self.client, name, queues, slots, lapses)
        self.announced = now

    def wanted_depth(self, queue: str) -> int:
        """How many steps to keep on the queue's broker list at least (its base, see
        `Depths`): `dispatch_depth`, or a DEPTH_SHARE of the turns its live workers can hold
        in flight if that is more (read at most once a second)."""
        return self._capacity(queue)[0]

    def _capacity(self, queue: str, every_s: float = 1.0) -> tuple[int, int]:
        """The queue's base depth and the most its list is kept deep: the turns its live
        workers can hold in flight (the base, if more), read at most once every `every_s`."""
        now = time.monotonic()
        read_at, depth, slots = self.depths.get(queue, (0.0, 0, 0))
        if now - read_at >= every_s:
            slots = pending.live_capacity(self.client, queue)
            depth = max(self.config.dispatch_depth, slots // DEPTH_SHARE)
            self.depths[queue] = (now, depth, slots)
        return depth, max(depth, slots)

    def room(self, queue: str) -> int:
        """How many steps to send to the queue now (see `Depths`)."""
        base, ceiling = self._capacity(queue)
        if self.deeper.wanted.get(queue, 0) >= ceiling > base:
            # Held at the workers' capacity: read it sooner (a worker that just started).
            base, ceiling = self._capacity(queue, CEILING_EVERY_S)
        on_broker = None if self.broker_depth is None else self.broker_depth(queue)
        return self.deeper.room(queue, base, ceiling, on_broker)

    def dispatch(self) -> int:
        """One pass over every queue; returns how many steps were sent to the broker. A
        broken queue is skipped (see the module's text), the others go on."""
        sent = 0
        self.next_due_s = self.promoter.promote()
        self._read_records()
        now = time.monotonic()
        for queue in pending.queues(self.client):
            if queue in self.broken and now < self.broken[queue][1]:
                continue
            try:
                room = self.room(queue)
                filled = self._fill(queue, room) if room > 0 else 0
                self.deeper.sent(queue, room, filled)
                sent += filled
            except redis.ResponseError as exc:  # the queue's keys, not the store: skip it
                self._broken(queue, str(exc))
            else:
                self._mended(queue)
        return sent

    def _broken(self, queue: str, error: str) -> None:
        """Skip the queue for BROKEN_RECHECK_S; said and recorded once per error."""
        said = self.broken.get(queue, ("", 0.0))[0]
        self.broken[queue] = (error, time.monotonic() + BROKEN_RECHECK_S)
        if error == said:
            return
        log.error("queue_broken", by="dispatcher", queue=queue, error=error)
        with contextlib.suppress(redis.RedisError):  # the log line is said all the same
            served_queues.mark_broken(self.client, queue, error, server_ms(self.client))
            self.recorded.add(queue)

    def _mended(self, queue: str) -> None:
        """A pass over the queue worked: it is broken no more, here and in the store."""
        if self.broken.pop(queue, None) is not None:
            log.info("queue_mended", by="dispatcher", queue=queue)
        if queue in self.recorded:
            served_queues.mark_mended(self.client, queue)
            self.recorded.discard(queue)

    def _read_records(self) -> None:
        """The queues the store records as broken (another dispatcher may have found them),
        read at most once a RECORDS_EVERY_S, so a pass that works clears their record."""
        now = time.monotonic()
        if now - self.recorded_at >= RECORDS_EVERY_S:
            self.recorded = set(served_queues.broken(self.client))
            self.recorded_at = now

    def _fill(self, queue: str, room: int) -> int:
        tenants = pending.active_tenants(self.client, queue)
        if not tenants:
            pending.drop_queue(self.client, queue)  # as for a tenant (see pending.drop_tenant)
            return 0
        weights = self._weights(tenants)
        rr = self.rr.setdefault(queue, RoundRobin())
        sent = 0
        while sent < room and tenants:
            # The round robin's next picks for the room left, taken in one round trip; a
            # tenant that could not give one (empty, capped) leaves the pass. A take the server
            # refused (the queue is broken) leaves the others' steps to be sent, then says so.
            picks = self._picks(rr, tenants, weights, queue, room - sent)
            batch, refused = [], None
            for tenant, entry in zip(picks, self._take_many(picks, queue), strict=True):
                if isinstance(entry, dict):
                    batch.append(entry)
                    continue
                refused = entry if isinstance(entry, redis.ResponseError) else refused
                if tenant in tenants:
                    tenants.remove(tenant)
                    if rr.last == tenant:
                        rr.skip()
            self._send(batch)
            sent += len(batch)
            if refused is not None:
                raise refused
        return sent

    def _picks(
        self, rr: RoundRobin, tenants: list[str], weights: Mapping[str, int], queue: str,
        most: int,
    ) -> list[str]:  # fmt: skip
        """The round robin's next `most` picks, each tenant picked at most once more than the
        steps it has pending (read here, one round trip): that last take finds it empty and
        drops it, as before. Without the bound, a pass with room for hundreds (a DEPTH_SHARE of
        thousands of green slots) ran a take per slot of room whatever was pending: 500 takes
        and 7 ms of CPU to send 5 steps (tests/bench/bench_dispatch_pass.py). A count the
        server refused (the queue is broken) leaves the tenant one take, which says so."""
        budget = {t: n + 1 for t, n in pending.waiting(self.client, tenants, queue).items()}
        picks: list[str] = []
        left = [t for t in tenants if budget[t] > 0]
        while len(picks) < most and left:
            tenant = rr.pick(left, weights) or ""
            picks.append(tenant)
            budget[tenant] -= 1
            if not budget[tenant]:
                left.remove(tenant)
        return picks

    def _weights(self, tenants: list[str]) -> dict[str, int]:
        """The tenants' weights, read at most once a second (they change by hand)."""
        now = time.monotonic()
        if now - self.weights_at > WEIGHTS_EVERY_S or any(t not in self.weights for t in tenants):
            self.weights = read_weights(self.client, tenants)
            self.weights_at = now
        return self.weights

    def _take(self, tenant: str, queue: str) -> dict[str, Any] | None:
        return self._taken(tenant, queue, self.taker.take(tenant, queue))

    def _take_many(
        self, tenants: list[str], queue: str
    ) -> list[dict[str, Any] | redis.ResponseError | None]:
        """One take per tenant named (a tenant named twice gives two steps), in one round
        trip (pending.Taker.take_many); a take the server refused is its error, in its place."""
        replies = self.taker.take_many(tenants, queue)
        taken: dict[str, dict[str, Any] | None] = {}
        out: list[dict[str, Any] | redis.ResponseError | None] = []
        for tenant, reply in zip(tenants, replies, strict=True):
            if isinstance(reply, Exception):
                if not isinstance(reply, redis.ResponseError):
                    raise reply  # the store, not the queue
                out.append(reply)
                continue
            if reply[0] != "ok" and tenant in taken:  # said once per tenant is enough
                out.append(None)
                continue
            taken[tenant] = entry = self._taken(tenant, queue, reply)
            out.append(entry)
        return out

    def _taken(self, tenant: str, queue: str, reply: list[Any]) -> dict[str, Any] | None:
        """The entry a take gave, or None: the tenant has nothing pending (dropped from the
        queue's set) or is at a cap (its active runs are pruned, then it tries again)."""
        if reply[0] == "ok":
            entry: dict[str, Any] = json.loads(reply[1])
            entry[PRIORITY] = int(reply[2])  # noted with the step as sent (pending.Sent)
            return entry
        if reply[0] == "empty":
            self._drop(tenant, queue)
        elif reply[0] == "capped_runs" and self.prune(tenant):
            return self._take(tenant, queue)
        return None

    def prune(self, tenant: str) -> int:
        """Drop the runs that ended from the tenant's active set; how many were dropped. Run
        when the set is at its cap, so it reads at most the cap's worth of runs (a run that
        ended by a path that did not drop it is found here, so no cap fills up for good)."""
        return pending.prune_active(self.client, tenant)

    def _drop(self, tenant: str, queue: str) -> None:
        """Drop a tenant with nothing pending from the queue's set (pending.drop_tenant: a
        step pushed meanwhile re-adds it)."""
        pending.drop_tenant(self.client, tenant, queue)

    def _send(self, entries: list[dict[str, Any]]) -> None:
        if not entries:
            return
        batch = [
            (
                StepMessage(
                    str(e["tenant"]), str(e["run_id"]), int(e["version"]), str(e["queue"]),
                    str(e.get("traceparent") or ""),
                ),
                float(e["soft_s"]),
                float(e["hard_s"]),
            )
            for e in entries
        ]  # fmt: skip
        refused: redis.ResponseError | None = None
        try:
            self._mark_sent(batch, [int(e[PRIORITY]) for e in entries])
        except redis.ResponseError as exc:  # the queue's key: sent all the same, then said
            refused = exc
        except Exception as exc:  # then a commit may claim past these steps: only less fair
            log.warning("dispatch_mark_failed", error=str(exc), steps=len(batch))
        try:
            self.publish(batch)
        except redis.ResponseError:
            raise  # the broker refused the queue's list (or its binding): the queue is broken
        except Exception as exc:  # the runs' pickup leases lapse and the sweeper re-sends them
            log.warning("dispatch_failed", error=str(exc), steps=len(batch),
                        run_ids=[m.run_id for m, _, _ in batch[:5]])  # fmt: skip
        if refused is not None:
            raise refused

    def _mark_sent(
        self, batch: list[tuple[StepMessage, float, float]], priorities: list[int]
    ) -> None:  # fmt: skip
        """Note each step as sent and not yet loaded, with its run's priority (keys.fair_sent;
        its load removes it), before it is published: while another tenant's step, or one of
        a higher priority, waits on the broker, no commit claims its own run's next step.
        Entries older than the window are dropped (lost on the way)."""
        now = server_ms(self.client)
        steps = [
            pending.Sent(msg.tenant, msg.run_id, msg.version, msg.queue, priority)
            for (msg, _, _), priority in zip(batch, priorities, strict=True)
        ]
        self.sent_tenants |= {msg.tenant for msg, _, _ in batch}
        pending.mark_sent(self.client, steps, now_ms=now, window_ms=self.sent_window_ms)

    def _gauges(self) -> None:
        """Each tenant's share as metrics, once a second: the tenants with steps waiting or
        sent since, and those shown last time (so a tenant whose work ended is shown at zero
        once)."""
        now = time.monotonic()
        if not metrics.enabled() or now - self.gauged < GAUGES_EVERY_S:
            return
        self.gauged = now
        queues = [q for q in pending.queues(self.client) if q not in self.broken]
        shown = self.gauge_tenants | self.sent_tenants
        self.sent_tenants = set()
        for queue in queues:
            with contextlib.suppress(redis.ResponseError):  # broken: its dispatch says so
                shown |= set(pending.active_tenants(self.client, queue))
        self.gauge_tenants = set()
        for tenant in sorted(shown):
            v = tenant_view(self.client, tenant, queues)
            metrics.tenant_share(tenant, waiting=v.waiting, in_flight=v.in_flight, cap=v.cap)
            if v.waiting or v.in_flight:
                self.gauge_tenants.add(tenant)

    def loop(self, stop: threading.Event) -> None:
        """Dispatch while this worker leads, until `stop`; then give the lock up, so that
        another worker's dispatcher takes over at its next try (within a second) instead of
        after LOCK_MS: a deploy's stopped workers held dispatch up for up to 3 s."""
        try:
            self._loop(stop)
        finally:
            with contextlib.suppress(Exception):  # the store is down: the lock lapses
                locks.resign(self.client, locks.DISPATCHER, self.token)

    def _loop(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                self.announce()
                if not self.leader():
                    stop.wait(LOCK_MS / 3000)
                    continue
                self.dispatch()
                self._gauges()
                if self.linger_s:
                    stop.wait(self.linger_s)
                poll_s = self.config.dispatch_poll_s
                if self.next_due_s is not None:  # wake when the next deferred step is due
                    poll_s = min(poll_s, max(0.01, self.next_due_s))
                pending.wait_nudge(self.client, poll_s)
            except Exception as exc:  # the store may be down: try again shortly
                log.warning("dispatch_pass_failed", error=str(exc))
                stop.wait(self.config.dispatch_poll_s)
