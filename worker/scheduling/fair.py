"""Fair share between tenants and per-tenant caps on turns in flight.

A Celery queue is first come, first served: a tenant that enqueues thousands of runs makes
every other tenant wait behind all of them. So a step message does not go straight to the
broker: `route` (the one place that decides where a step goes) puts it in its tenant's pending
set on its queue (continuations and first steps apart, in the tenant's hash slot, ordered by
the run's priority and the time queued: see fair_lib.lua and priority.py), and the dispatcher
(dispatcher.py) moves steps from the tenants' sets to the broker, round robin between
tenants, each tenant's by effective priority, skipping a tenant at its cap on turns in flight.
A step takes a slot when dispatched and gives it back when its delivery is done (`release`),
which nudges the dispatcher: a capped tenant's next step waits in Redis, holding no worker and
re-publishing nothing, and goes as soon as one of its turns ends.

A turn's commit queues its run's next step itself (run_commit.lua, through fair_lib.lua), so
the step exists if and only if the commit does. A slot whose step was lost lapses by itself
(the step's hard limit plus the pickup lease). With `TURNSTILE_FAIR_SHARE=0` every step is
published at once, as before.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis

from turnstile.errors import TurnstileError
from turnstile.worker.broker.message import StepMessage
from turnstile.worker.settings import Settings
from turnstile.worker.store import keys
from turnstile.worker.store.connect import is_cluster
from turnstile.worker.store.queues import TENANT_QUEUES
from turnstile.worker.store.runs import Claim, inflight_tag
from turnstile.worker.store.scripts import FAIR, evalsha, register, with_scripts
from turnstile.worker.store.values import is_cluster_client, server_ms

Publish = Callable[[StepMessage, float, float], None]
CAPS = ("turns_in_flight", "active_runs", "weight")  # what `turnstile tenants set` accepts
REMOVABLE = ("turns_in_flight", "active_runs")  # NAME=none removes it; a weight is 1 by default


class CapError(TurnstileError):
    """A tenant setting that is not a setting (a negative cap, a weight of zero, ...)."""


# -- routing: the one function that says where a step message goes ---------------------------


def route(
    client: redis.Redis, config: Settings, publish: Publish
) -> Callable[[StepMessage, float, float], None]:
    """The send function every sender uses (the client, the sweeper, resume, and a step's
    next step where its commit did not queue it): straight to the broker with fair share
    off, else into the tenant's pending list."""
    if not config.fair_share:
        return publish
    # Registering computes the script's sha here: building a sender does no I/O (a server
    # that does not have the script yet says NOSCRIPT, and it is loaded then).
    push = register(client, "fair_push", FAIR)

    in_order = is_cluster_client(client)

    def send(msg: StepMessage, soft_s: float, hard_s: float) -> None:
        queued = pending_entry(msg, soft_s, hard_s)

        def build(pipe: Any) -> None:
            evalsha(pipe, push, [*queued.keys, queued.run_key], queued.args)
            if not in_order:
                queued.announce(pipe)

        with_scripts(client, (push,), build)
        if in_order:  # a cluster's pipeline keeps no order across nodes: the entry first
            pipe = client.pipeline(transaction=False)
            queued.announce(pipe)
            pipe.execute()

    return send


@dataclass(frozen=True)
class Pending:
    """A step as its tenant's pending set takes it: `fair_queue`'s keys and arguments (see
    fair_lib.lua), and what tells the dispatcher it is there."""

    tenant: str
    queue: str
    keys: list[str]  # the pending set, the pending index, the slots
    args: list[str]  # run id, version, entry, the slot to give back

    @property
    def run_key(self) -> str:
        """The run's hash, whose priority orders the step (a commit's script has it already)."""
        return keys.run(self.tenant, self.args[0])

    @property
    def entry(self) -> str:
        return self.args[2]

    @property
    def before(self) -> str:
        return self.args[3]

    def announce(self, pipe: Any) -> None:
        """After the entry: a dispatcher that found the tenant empty and dropped it from the
        set looks at its lists again after the drop (see dispatcher.Dispatcher._drop)."""
        pipe.sadd(keys.fair_active(self.queue), self.tenant)
        pipe.sadd(keys.FAIR_QUEUES, self.queue)
        _nudge(pipe)


def pending_entry(msg: StepMessage, soft_s: float, hard_s: float) -> Pending:
    """The pending-set entry of a step message: continuations and first steps apart (its
    priority is its run's, read by the script that queues it)."""
    kind = "cont" if msg.version > 1 else "start"
    entry = json.dumps(
        {**msg.as_kwargs(), "soft_s": soft_s, "hard_s": hard_s}, separators=(",", ":")
    )
    before = f"{msg.run_id}:{msg.version - 1}" if msg.version > 1 else ""
    return Pending(
        msg.tenant,
        msg.queue,
        [keys.pending(msg.tenant, msg.queue, kind), keys.pending_index(msg.tenant),
         keys.slots(msg.tenant)],
        [msg.run_id, str(msg.version), entry, before],
    )  # fmt: skip


def claim(msg: StepMessage, hard_s: float, config: Settings, token: str) -> Claim:
    """What a commit needs to claim the run's next step `msg` for this worker (eager
    continuation; see run_commit.lua for the check), to be loaded as delivery `token`. The
    claimed step's slot lapses as a dispatched one's does (fair_take.lua): its hard limit and
    the pickup lease; another tenant's step sent to the broker counts as waiting for a pickup
    lease, after which it is taken as lost (the sweeper sends it again, through its pending
    list)."""
    args = [msg.tenant, str(int(config.inflight_lease_s * 1000)), inflight_tag(msg.queue),
            token, str(sent_window_ms(config)), str(slot_extra_ms(config) + int(hard_s * 1000)),
            msg.queue]  # fmt: skip
    tenant_keys = [keys.control(msg.tenant), keys.caps(msg.tenant)]
    starts, aging = keys.pending(msg.tenant, msg.queue, "start"), str(aging_ms(config))
    if config.redis_url is not None and is_cluster(config.redis_url):
        # The queue's keys are in no tenant's slot: read before the commit (queue_allows).
        window = sent_window_ms(config)
        return Claim(
            keys=[*tenant_keys, starts], args=[*args, "1", aging],
            queue_allows=lambda client: queue_allows_claim(client, msg.tenant, msg.queue, window),
        )  # fmt: skip
    return Claim(
        keys=[*tenant_keys, keys.queue_control(msg.queue), keys.fair_active(msg.queue),
              keys.fair_sent(msg.queue), keys.FAIR_QUEUES, keys.FAIR_WAKE, starts],
        args=[*args, "", aging],
    )  # fmt: skip


def aging_ms(config: Settings) -> int:
    """How long a pending step waits to gain a priority level (see fair_lib.lua), at least 1."""
    return max(1, int(config.priority_aging_s * 1000))


def queue_allows_claim(client: redis.Redis, tenant: str, queue: str, window_ms: int) -> bool:
    """The queue's part of an eager commit's check (run_commit.lua's `may_claim`), read in one
    round trip on a cluster, where the script cannot: the queue is neither paused nor
    draining, no other tenant has steps pending on it, and no step sent to the broker in the
    last `window_ms` waits there but this tenant's own first steps."""
    pipe = client.pipeline(transaction=False)
    pipe.hmget(keys.queue_control(queue), "paused", "draining")
    pipe.scard(keys.fair_active(queue))
    pipe.sismember(keys.fair_active(queue), tenant)
    pipe.zrevrangebyscore(keys.fair_sent(queue), "+inf", "-inf", start=0, num=257,
                          withscores=True)  # fmt: skip
    flags, active, own, sent = pipe.execute()
    if any(flags) or int(active) - int(bool(own)) > 0:
        return False
    if not sent:
        return True
    since = server_ms(client) - window_ms  # the store's clock (a cluster's pipeline has none)
    recent = [str(member) for member, score in sent if score >= since]
    if len(recent) > 256:
        return False
    mine = f"{tenant}|"
    return all(m.startswith(mine) and m.rpartition(":")[2] == "1" for m in recent)


def slot_extra_ms(config: Settings) -> int:
    """How long a step's slot outlives its hard time limit: time to wait on the queue (the
    pickup lease), whether the dispatcher took the step (fair_take.lua) or a commit claimed it."""
    return int(config.pickup_lease_s * 1000)


def sent_window_ms(config: Settings) -> int:
    """How long a step sent to the broker counts as waiting there (see keys.fair_sent)."""
    return int(config.pickup_lease_s * 1000)


def _nudge(pipe: Any) -> None:
    pipe.lpush(keys.FAIR_WAKE, "1")
    pipe.ltrim(keys.FAIR_WAKE, 0, 0)  # one nudge is enough, however many came


def release(
    client: redis.Redis, tenant: str, run_id: str, version: int, *, ended: bool = False
) -> None:
    """The step's delivery is done (committed, skipped, failed): give its slot back (and, if
    the run `ended`, its place among the active runs) and nudge the dispatcher, so the
    tenant's next step goes now."""
    pipe = client.pipeline(transaction=False)
    pipe.zrem(keys.slots(tenant), f"{run_id}:{version}")
    if ended:
        pipe.zrem(keys.active(tenant), run_id)
    _nudge(pipe)
    pipe.execute()


# -- caps -----------------------------------------------------------------------------------


def parse_caps(pairs: Iterable[str]) -> dict[str, int | None]:
    """`turns_in_flight=20 active_runs=100 weight=2` as settings; `NAME=none` removes a cap.
    Every pair is checked before anything is written."""
    out: dict[str, int | None] = {}
    for pair in pairs:
        name, sep, raw = pair.partition("=")
        if not sep or name not in CAPS:
            raise CapError(f"bad setting {pair!r}: expected NAME=VALUE, NAME one of {CAPS}")
        if raw in ("none", "") and name in REMOVABLE:
            out[name] = None
            continue
        if not raw.isdigit():
            raise CapError(f"{name} must be a whole number >= {_least(name)}, not {raw!r}")
        value = int(raw)
        if value < _least(name):
            raise CapError(f"{name} must be a whole number >= {_least(name)}, not {raw!r}")
        out[name] = value
    if not out:
        raise CapError(f"nothing to set: give NAME=VALUE, NAME one of {CAPS}")
    return out


def _least(name: str) -> int:
    # A weight of 0 would never be served; a cap of 0 is a pause, which `pause` says better.
    return 1


def set_caps(client: redis.Redis, tenant: str, caps: Mapping[str, int | None]) -> None:
    """Write a tenant's settings (a tenant not seen yet is allowed: they apply from its first
    submission). Removing a cap wakes the dispatcher, so steps waiting on it go at once."""
    pipe = client.pipeline(transaction=True)  # the tenant's settings: one key, one slot
    for name, value in caps.items():
        if value is None:
            pipe.hdel(keys.caps(tenant), name)
        else:
            pipe.hset(keys.caps(tenant), name, value)
    pipe.execute()
    pipe = client.pipeline(transaction=False)  # then the nudge (another slot on a cluster)
    _nudge(pipe)
    pipe.execute()


def pending_counts(client: redis.Redis, tenants: Sequence[str], queue: str) -> dict[str, int]:
    """Steps each of `tenants` has waiting in its pending sets on `queue`, read in one round
    trip (one command per set, no script: the tenants' keys lie in different slots). What
    counts the backlog reads their sizes through here only."""
    pipe = client.pipeline(transaction=False)
    for tenant in tenants:
        pipe.zcard(keys.pending(tenant, queue, "cont"))
        pipe.zcard(keys.pending(tenant, queue, "start"))
    lengths = [int(n) for n in pipe.execute()]
    return {t: lengths[2 * i] + lengths[2 * i + 1] for i, t in enumerate(tenants)}


@dataclass(frozen=True)
class TenantView:
    tenant: str
    waiting: int  # steps in its pending lists, every queue
    in_flight: int  # slots held: dispatched and not yet done
    cap: int | None  # on turns in flight
    weight: int
    active_runs: int = 0  # runs whose first step went and that have not ended (as last seen)
    runs_cap: int | None = None  # on active runs
    # The queues whose pending sets of this tenant's the server refused to count (a key of
    # another type there: the queue is broken, see dispatcher.py); counted as 0 in `waiting`.
    broken: list[str] = field(default_factory=list)
    # The only queues the tenant may submit to ([]: the deployment's; worker/store/queues.py).
    queues: list[str] = field(default_factory=list)


def tenant_view(client: redis.Redis, tenant: str, queues: Iterable[str]) -> TenantView:
    names = list(queues)
    pipe = client.pipeline(transaction=False)
    for queue in names:
        pipe.zcard(keys.pending(tenant, queue, "cont"))
        pipe.zcard(keys.pending(tenant, queue, "start"))
    pipe.zcount(keys.slots(tenant), "(" + str(server_ms(client)), "+inf")
    pipe.hmget(keys.caps(tenant), "turns_in_flight", "weight", "active_runs", TENANT_QUEUES)
    pipe.zcard(keys.active(tenant))
    *lengths, in_flight, caps, active = pipe.execute(raise_on_error=False)
    for reply in (in_flight, caps, active):  # the tenant's own keys: no queue's
        if isinstance(reply, Exception):
            raise reply
    cap, weight, runs_cap, own_queues = caps
    refused = [isinstance(n, redis.ResponseError) for n in lengths]
    for n in lengths:
        if isinstance(n, Exception) and not isinstance(n, redis.ResponseError):
            raise n
    return TenantView(
        tenant,
        sum(int(n) for n, bad in zip(lengths, refused, strict=True) if not bad),
        int(in_flight),
        int(cap) if cap else None,
        int(weight) if weight else 1,
        int(active),
        int(runs_cap) if runs_cap else None,
        sorted({q for i, q in enumerate(names) if refused[2 * i] or refused[2 * i + 1]}),
        [q for q in str(own_queues or "").split(",") if q],
    )
