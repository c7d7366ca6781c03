"""Fair share's data: each tenant's pending sets of steps on a queue, its slots (turns in
flight) and active runs, and the queue's bookkeeping the dispatcher keeps (the tenants with
steps pending, the steps sent to the broker and not loaded, the workers' announced capacity,
the queues with pending steps, the nudge). The rules (who goes next, caps, the eager claim)
are worker/scheduling/fair.py's and the Lua scripts' (fair_lib.lua, fair_push.lua,
fair_take.lua, run_commit.lua); this module reads and writes their keys (keys.py).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis

from turnstile.jobs.outcomes import Status
from turnstile.worker.store import fields, keys
from turnstile.worker.store.controls import DRAINING, PAUSED
from turnstile.worker.store.queues import TENANT_QUEUES
from turnstile.worker.store.run_calls import sent_member
from turnstile.worker.store.scripts import FAIR, ScriptCall, evalsha, register, with_scripts
from turnstile.worker.store.tenants import WEIGHT
from turnstile.worker.store.values import is_cluster_client, server_ms, text, writing

CONTINUATIONS, FIRST_STEPS = "cont", "start"  # a tenant's two pending sets on a queue
SCAN_COUNT = 500  # members asked for per SSCAN call
SENT_SCAN = 257  # fair_sent entries an eager check reads: more than 256 recent is a no


# -- a step in its tenant's pending set -----------------------------------------------------


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
        set looks at its lists again after the drop (see `drop_tenant`)."""
        pipe.sadd(keys.fair_active(self.queue), self.tenant)
        pipe.sadd(keys.FAIR_QUEUES, self.queue)
        nudge(pipe)


def queued(tenant: str, queue: str, run_id: str, version: int, entry: str) -> Pending:
    """Step `version` of the run, as its pending set takes it: continuations and first steps
    apart; a continuation gives back the slot of the step before it."""
    kind = CONTINUATIONS if version > 1 else FIRST_STEPS
    before = f"{run_id}:{version - 1}" if version > 1 else ""
    return Pending(
        tenant, queue,
        [keys.pending(tenant, queue, kind), keys.pending_index(tenant), keys.slots(tenant)],
        [run_id, str(version), entry, before],
    )  # fmt: skip


def push_call(step: Pending, *, give_back: bool = True) -> ScriptCall:
    """fair_push.lua for `step` (without the slot to give back when `give_back` is False: a
    deferred step's went when its delivery was done)."""
    args = step.args if give_back else [*step.args[:3], ""]
    return ScriptCall([*step.keys, step.run_key], args)


def nudge(pipe: Any) -> None:
    """Wake the dispatcher: a push or a finished step."""
    pipe.lpush(keys.FAIR_WAKE, "1")
    pipe.ltrim(keys.FAIR_WAKE, 0, 0)  # one nudge is enough, however many came


class Pusher:
    """Puts steps in their tenants' pending sets (fair_push.lua), then announces them."""

    def __init__(self, client: redis.Redis) -> None:
        # Registering computes the script's sha here: building a sender does no I/O (a server
        # that does not have the script yet says NOSCRIPT, and it is loaded then).
        self.client = client
        self.script = register(client, "fair_push", FAIR)
        self.in_order = is_cluster_client(client)

    def push(self, step: Pending) -> None:
        """One step, and its announcement in the same round trip; on a cluster, whose pipeline
        keeps no order across nodes, the entry first, then its announcement."""
        call = push_call(step)

        def build(pipe: Any) -> None:
            evalsha(pipe, self.script, call.keys, call.args)
            if not self.in_order:
                step.announce(pipe)

        with_scripts(self.client, (self.script,), build)
        if self.in_order:
            pipe = self.client.pipeline(transaction=False)
            step.announce(pipe)
            pipe.execute()

    def push_many(self, steps: Sequence[Pending]) -> None:
        """Steps that give back no slot (deferred ones, due), each announced, in one trip."""

        def build(pipe: Any) -> None:
            for step in steps:
                call = push_call(step, give_back=False)
                evalsha(pipe, self.script, call.keys, call.args)
                step.announce(pipe)

        with_scripts(self.client, (self.script,), build)


# -- the eager claim's keys and the queue's part of its check -------------------------------


def claim_keys(tenant: str, queue: str, *, split: bool) -> list[str]:
    """run_commit.lua's keys for an eager claim (KEYS 17-24, or 17-19 on a cluster: `split`,
    the queue's keys being in no tenant's slot)."""
    tenant_keys = [keys.control(tenant), keys.caps(tenant)]
    starts = keys.pending(tenant, queue, FIRST_STEPS)
    if split:
        return [*tenant_keys, starts]
    return [*tenant_keys, keys.queue_control(queue), keys.fair_active(queue),
            keys.fair_sent(queue), keys.FAIR_QUEUES, keys.FAIR_WAKE, starts]  # fmt: skip


def queue_allows_claim(
    client: redis.Redis, tenant: str, queue: str, window_ms: int
) -> int | None:  # fmt: skip
    """The queue's part of an eager commit's check (run_commit.lua's `may_claim`), read in one
    round trip on a cluster, where the script cannot: None unless the queue is neither paused
    nor draining, no other tenant has steps pending on it, and no other tenant's step sent to
    the broker in the last `window_ms` waits there; then the highest priority of this
    tenant's continuations waiting there (-1: none), which the script holds against the run's
    (a claim passes only those of no higher priority)."""
    pipe = client.pipeline(transaction=False)
    pipe.hmget(keys.queue_control(queue), PAUSED, DRAINING)
    pipe.scard(keys.fair_active(queue))
    pipe.sismember(keys.fair_active(queue), tenant)
    pipe.zrevrangebyscore(keys.fair_sent(queue), "+inf", "-inf", start=0, num=SENT_SCAN,
                          withscores=True)  # fmt: skip
    flags, active, own, sent = pipe.execute()
    if any(flags) or int(active) - int(bool(own)) > 0:
        return None
    if not sent:
        return -1
    since = server_ms(client) - window_ms  # the store's clock (a cluster's pipeline has none)
    recent = [(str(member), float(score)) for member, score in sent if score >= since]
    if len(recent) > SENT_SCAN - 1:
        return None
    mine = f"{tenant}|"
    if not all(member.startswith(mine) for member, _ in recent):
        return None
    return max(
        (sent_priority(score) for member, score in recent if member.rpartition(":")[2] != "1"),
        default=-1,
    )


# -- a step's slot, and a tenant's steps ---------------------------------------------------


def release(
    client: redis.Redis, tenant: str, run_id: str, version: int, *, ended: bool = False,
    pipe: Any | None = None,
) -> None:  # fmt: skip
    """The step's delivery is done: its slot back (and, if the run `ended`, its place among
    the active runs), and the dispatcher nudged; in `pipe` when one is given."""
    with writing(client, pipe) as out:
        out.zrem(keys.slots(tenant), f"{run_id}:{version}")
        if ended:
            out.zrem(keys.active(tenant), run_id)
        nudge(out)


def step_queued(client: redis.Redis, tenant: str, run_id: str, version: str, now_ms: int) -> bool:
    """Whether step `version` of the run waits in its tenant's pending set, or was dispatched
    and holds a slot that has not lapsed."""
    pipe = client.pipeline(transaction=False)
    pipe.hget(keys.pending_index(tenant), run_id)
    pipe.zscore(keys.slots(tenant), f"{run_id}:{version}")
    pending, lapses = pipe.execute()
    return str(pending or "") == version or (lapses is not None and lapses > now_ms)


def counts(client: redis.Redis, tenants: Sequence[str], queue: str) -> dict[str, int]:
    """Steps each of `tenants` has waiting in its pending sets on `queue`, read in one round
    trip (one command per set, no script: the tenants' keys lie in different slots)."""
    pipe = client.pipeline(transaction=False)
    for tenant in tenants:
        pipe.zcard(keys.pending(tenant, queue, CONTINUATIONS))
        pipe.zcard(keys.pending(tenant, queue, FIRST_STEPS))
    lengths = [int(n) for n in pipe.execute()]
    return {t: lengths[2 * i] + lengths[2 * i + 1] for i, t in enumerate(tenants)}


def waiting(client: redis.Redis, tenants: Sequence[str], queue: str) -> dict[str, int]:
    """The same, for the dispatcher: a tenant whose sets the server refused to count (a key of
    another type there: the queue is broken) counts 0, and its take meets the error."""
    pipe = client.pipeline(transaction=False)
    for tenant in tenants:
        pipe.zcard(keys.pending(tenant, queue, CONTINUATIONS))
        pipe.zcard(keys.pending(tenant, queue, FIRST_STEPS))
    lengths = []
    for n in pipe.execute(raise_on_error=False):
        if isinstance(n, Exception) and not isinstance(n, redis.ResponseError):
            raise n
        lengths.append(0 if isinstance(n, Exception) else int(n))
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
    """The tenant's share: its steps pending on `queues`, its slots held, caps and weight."""
    names = list(queues)
    pipe = client.pipeline(transaction=False)
    for queue in names:
        pipe.zcard(keys.pending(tenant, queue, CONTINUATIONS))
        pipe.zcard(keys.pending(tenant, queue, FIRST_STEPS))
    pipe.zcount(keys.slots(tenant), "(" + str(server_ms(client)), "+inf")
    pipe.hmget(keys.caps(tenant), "turns_in_flight", WEIGHT, "active_runs", TENANT_QUEUES)
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


# -- the dispatcher's side ------------------------------------------------------------------


def take_call(tenant: str, queue: str, *, slot_extra_ms: int, aging_ms: int) -> ScriptCall:
    """fair_take.lua: the tenant's next step on the queue, within its caps."""
    return ScriptCall(
        [keys.pending(tenant, queue, CONTINUATIONS), keys.pending(tenant, queue, FIRST_STEPS),
         keys.pending_index(tenant), keys.slots(tenant), keys.caps(tenant), keys.active(tenant)],
        [slot_extra_ms, aging_ms],
    )  # fmt: skip


class Taker:
    """Takes steps from the tenants' pending sets (fair_take.lua): a pop and a slot each."""

    def __init__(self, client: redis.Redis, *, slot_extra_ms: int, aging_ms: int) -> None:
        self.client, self.slot_extra_ms, self.aging_ms = client, slot_extra_ms, aging_ms
        self.script = register(client, "fair_take", FAIR)

    def _call(self, tenant: str, queue: str) -> ScriptCall:
        return take_call(tenant, queue, slot_extra_ms=self.slot_extra_ms, aging_ms=self.aging_ms)

    def take(self, tenant: str, queue: str) -> Any:
        """The script's reply: ("ok", entry, priority), ("empty",) or a cap's name."""
        call = self._call(tenant, queue)
        return self.script(keys=call.keys, args=call.args)

    def take_many(self, tenants: Sequence[str], queue: str) -> list[Any]:
        """One take per tenant named (a tenant named twice gives two steps), in one round
        trip (see `with_scripts`: a take that NOSCRIPT refused took nothing); a take the
        server refused is its error, in its place."""

        def build(pipe: Any) -> None:
            for tenant in tenants:
                call = self._call(tenant, queue)
                evalsha(pipe, self.script, call.keys, call.args)

        return with_scripts(self.client, (self.script,), build, raise_on_error=False)


def queues(client: redis.Redis) -> list[str]:
    """The queues that may have pending steps, by name."""
    return sorted(str(q) for q in client.smembers(keys.FAIR_QUEUES))


def active_tenants(client: redis.Redis, queue: str) -> list[str]:
    """The tenants that may have steps pending on `queue`, by name."""
    return sorted(text(t) for t in client.smembers(keys.fair_active(queue)))


def scan_active(client: redis.Redis, queue: str) -> Iterator[list[str]]:
    """The same, a slice at a time (SSCAN: a member present throughout is seen, maybe twice)."""
    cursor = 0
    while True:
        cursor, members = client.sscan(keys.fair_active(queue), cursor, count=SCAN_COUNT)
        if members:
            yield [text(m) for m in members]
        if int(cursor) == 0:
            return


def drop_queue(client: redis.Redis, queue: str) -> None:
    """Drop a queue with no tenant from the set, then look again: a push adds its queue after
    its tenant, so one pushed meanwhile is put back."""
    client.srem(keys.FAIR_QUEUES, queue)
    if client.scard(keys.fair_active(queue)):
        client.sadd(keys.FAIR_QUEUES, queue)


def drop_tenant(client: redis.Redis, tenant: str, queue: str) -> None:
    """Drop a tenant with nothing pending from the queue's set, then look again: a step
    pushed meanwhile re-adds it (its push adds after its entry, and we look after)."""
    client.srem(keys.fair_active(queue), tenant)
    pipe = client.pipeline(transaction=False)
    pipe.zcard(keys.pending(tenant, queue, CONTINUATIONS))
    pipe.zcard(keys.pending(tenant, queue, FIRST_STEPS))
    if sum(int(n) for n in pipe.execute()):
        client.sadd(keys.fair_active(queue), tenant)


LIVE = (Status.RUNNING.value, Status.SUSPENDED.value, Status.PARKED.value)  # active runs


def prune_active(client: redis.Redis, tenant: str) -> int:
    """Drop the runs that ended from the tenant's active set; how many were dropped."""
    run_ids = [str(r) for r in client.zrange(keys.active(tenant), 0, -1)]
    pipe = client.pipeline(transaction=False)
    for run_id in run_ids:
        pipe.hget(keys.run(tenant, run_id), fields.STATUS)
    ended = [r for r, status in zip(run_ids, pipe.execute(), strict=True) if status not in LIVE]
    if ended:
        client.zrem(keys.active(tenant), *ended)
    return len(ended)


@dataclass(frozen=True)
class Sent:
    """A step the dispatcher sends to the broker, as keys.fair_sent notes it."""

    tenant: str
    run_id: str
    version: int
    queue: str
    priority: int  # its run's, as fair_take.lua took it


def sent_score(now_ms: int, priority: int) -> float:
    """A sent step's score in keys.fair_sent: when it was sent (ms) and, as the fraction
    (priority + 1) / 16, its run's priority (fair_lib.lua `fair_sent_priority` reads it; exact
    in a double for any time in ms)."""
    return now_ms + (min(9, max(0, priority)) + 1) / 16


def sent_priority(score: float) -> int:
    """The priority a keys.fair_sent score holds (`sent_score`); 10, above every priority, for
    a score that holds none."""
    p = round((score - math.floor(score)) * 16) - 1
    return p if 0 <= p <= 9 else 10


def mark_sent(
    client: redis.Redis, steps: Sequence[Sent], *, now_ms: int, window_ms: int,
    pipe: Any | None = None,
) -> None:  # fmt: skip
    """Note each step as sent to the broker and not yet loaded (keys.fair_sent; its load
    removes it), with its priority; entries older than the window are dropped."""
    with writing(client, pipe) as out:
        for queue in {step.queue for step in steps}:
            out.zremrangebyscore(keys.fair_sent(queue), "-inf", now_ms - window_ms)
        for step in steps:
            member = sent_member(step.tenant, step.run_id, step.version)
            out.zadd(keys.fair_sent(step.queue), {member: sent_score(now_ms, step.priority)})


def sent_since(client: redis.Redis, queue: str, since_ms: int) -> int:
    """Steps sent to the broker on `queue` since `since_ms` that no delivery has loaded."""
    return int(client.zcount(keys.fair_sent(queue), since_ms, "+inf"))


def announce_capacity(
    client: redis.Redis, worker: str, queues: Iterable[str], slots: int, lapses_ms: int, *,
    pipe: Any | None = None,
) -> None:  # fmt: skip
    """Say that `worker` can hold `slots` turns in flight on each of `queues`, until then."""
    with writing(client, pipe) as out:
        for queue in queues:
            out.zadd(keys.fair_capacity(queue), {f"{worker}|{slots}": lapses_ms})


def live_capacity(client: redis.Redis, queue: str) -> int:
    """The turns the live workers reading `queue` can hold in flight; lapsed ones dropped."""
    key = keys.fair_capacity(queue)
    pipe = client.pipeline(transaction=False)
    pipe.zremrangebyscore(key, "-inf", server_ms(client))
    pipe.zrange(key, 0, -1)
    _, live = pipe.execute()
    return sum(int(str(entry).rpartition("|")[2] or 0) for entry in live)


def wake(client: redis.Redis, *, pipe: Any | None = None) -> None:
    """Nudge the dispatcher on its own (a cap removed: steps waiting on it go at once)."""
    with writing(client, pipe) as out:
        nudge(out)


def wait_nudge(client: redis.Redis, timeout_s: float) -> None:
    """Block until a nudge comes or `timeout_s` passes."""
    client.blpop([keys.FAIR_WAKE], timeout=timeout_s)
