"""Operator controls that live in Redis: pause, resume and drain queues and tenants, and the
views an operator reads (runs, one run, its events and trace, queues).

The flags are read by every step at its gate, in the same round trip as the run, so they are
honoured at every turn boundary by every worker, running now or started later; a step that
finds its queue or tenant paused (or its queue draining) parks the run and acks. Resuming
clears the flag and re-enqueues each parked run exactly once: the run moves parked -> running
through the store's version compare-and-set, and only the caller whose commit won sends the
step, so two resumes racing each other cannot both send it.

Flag hashes: a tenant's `control` hash and a queue's `turnstile:queue:<Q>` hash hold `paused`
(and, for a queue, `draining`) as the ISO time the flag was set, `paused_by` / `draining_by`
as who set it, and `resumed_at` / `resumed_by` for the last resume.
"""

from __future__ import annotations

import base64
import contextlib
import re
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import msgspec

from turnstile.errors import DecisionRefusedError, RunNotFoundError
from turnstile.jobs.errors import StateFormatError
from turnstile.jobs.outcomes import Outcome, Status
from turnstile.jobs.state import RunState
from turnstile.jobs.trace import Span
from turnstile.worker.broker.layout import broker_depth, dead_letter_count
from turnstile.worker.broker.message import StepMessage
from turnstile.worker.client._client import Client, check_name
from turnstile.worker.ops.errors import ControlError, DrainTimeoutError
from turnstile.worker.runtime.limits import next_hold, time_limits
from turnstile.worker.scheduling import fair
from turnstile.worker.scheduling.sweeper import time_limits_default
from turnstile.worker.store import keys
from turnstile.worker.store.runs import Change, now_iso
from turnstile.worker.store.values import server_ms, text

# A step that read a flag just before it was cleared still parks its run, a few milliseconds
# later; resume looks at the parked set again once such steps are done, waiting at most this.
PARK_SETTLE_S = 2.0
DRAIN_POLL_S = 0.2


# -- subject --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Subject:
    """What a control applies to: one queue (across tenants) or one tenant (across queues)."""

    queue: str | None = None
    tenant: str | None = None

    def __post_init__(self) -> None:
        if (self.queue is None) == (self.tenant is None):
            raise ControlError("give exactly one of a queue or a tenant")
        check_name("queue" if self.queue is not None else "tenant", self.queue or self.tenant)

    @property
    def kind(self) -> str:  # "queue" | "tenant", as Flagged and Resumed name it
        return "queue" if self.queue is not None else "tenant"

    @property
    def name(self) -> str:
        name = self.queue if self.queue is not None else self.tenant
        assert name is not None
        return name

    @property
    def flag_key(self) -> str:
        if self.queue is not None:
            return keys.queue_control(self.queue)
        assert self.tenant is not None
        return keys.control(self.tenant)


SCAN_COUNT = 500  # members asked for per SSCAN call: indexes are read in slices


def tenants(c: Client) -> list[str]:
    """Every tenant with runs, by name, read in slices (a tenant is far fewer keys than its
    runs; the runs themselves are only ever read a page at a time)."""
    return sorted({text(t) for t in c.client.sscan_iter(keys.TENANTS, count=SCAN_COUNT)})


def _scan(c: Client, key: str) -> Iterator[list[str]]:
    """A set's members in slices of about SCAN_COUNT (SSCAN: a member present throughout is
    seen, maybe twice)."""
    cursor = 0
    while True:
        cursor, members = c.client.sscan(key, cursor, count=SCAN_COUNT)
        if members:
            yield [text(m) for m in members]
        if int(cursor) == 0:
            return


def check_known(c: Client, subject: Subject) -> None:
    if subject.queue is not None and not c.client.sismember(keys.QUEUES, subject.queue):
        raise ControlError(f"unknown queue {subject.queue!r}")
    if subject.tenant is not None and not c.client.sismember(keys.TENANTS, subject.tenant):
        raise ControlError(f"unknown tenant {subject.tenant!r}")


# -- pause, drain -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Flagged:
    """A pause or a drain as it stands after the command: `already` when it was set before."""

    target: str  # "queue" | "tenant"
    name: str
    flag: str  # "paused" | "draining"
    by: str
    at: str
    already: bool


def _set_flag(c: Client, subject: Subject, flag: str, by: str) -> Flagged:
    check_known(c, subject)
    at = now_iso()
    key = subject.flag_key
    if c.client.hsetnx(key, flag, at):
        c.client.hset(key, f"{flag}_by", by)
        already = False
    else:
        at, by = (text(v) for v in c.client.hmget(key, flag, f"{flag}_by"))
        already = True
    return Flagged(subject.kind, subject.name, flag, by, at, already)


def pause(c: Client, subject: Subject, *, by: str) -> Flagged:
    """Pause a queue or a tenant: from the next turn boundary on, every step of it parks its
    run instead of reserving anything. Pausing what is paused changes nothing."""
    return _set_flag(c, subject, "paused", by)


def drain(c: Client, queue: str, *, by: str) -> Flagged:
    """Drain a queue: new submissions to it are refused, turns in flight finish, and their
    runs park at the next boundary. Draining what is draining changes nothing."""
    return _set_flag(c, Subject(queue=queue), "draining", by)


# -- resume ---------------------------------------------------------------------------------


@dataclass
class Resumed:
    target: str
    name: str
    by: str
    at: str
    cleared: list[str]  # the flags this resume cleared
    resumed: list[str] = field(default_factory=list)  # run ids re-enqueued, each once
    deferred: list[str] = field(default_factory=list)  # of those, left to the sweeper to send
    still_parked: int = 0  # parked runs of the subject held back by another flag


def _clear_flags(c: Client, subject: Subject) -> list[str]:
    flags = ["paused"] if subject.queue is None else ["paused", "draining"]
    pipe = c.client.pipeline(transaction=True)
    pipe.hmget(subject.flag_key, *flags)
    pipe.hdel(subject.flag_key, *flags, *(f"{f}_by" for f in flags))
    values, _ = pipe.execute()
    return [f for f, v in zip(flags, values, strict=True) if v]


def _gates_clear(c: Client, tenant: str, queue: str, cache: dict[str, bool]) -> bool:
    """Would a step of this tenant on this queue run its turn now?"""
    if tenant not in cache:
        cache[tenant] = not c.client.hget(keys.control(tenant), "paused")
    qkey = f"queue:{queue}"
    if qkey not in cache:
        paused, draining = c.client.hmget(keys.queue_control(queue), "paused", "draining")
        cache[qkey] = not paused and not draining
    return cache[tenant] and cache[qkey]


def parked_runs(c: Client, subject: Subject) -> list[tuple[str, str, str]]:
    """(tenant, run id, queue) of every parked run of the subject; a queue's look across tenants."""
    out = set()
    for tenant in [subject.tenant] if subject.tenant is not None else tenants(c):
        for ids in _scan(c, keys.by_status(tenant, "parked")):
            pipe = c.client.pipeline(transaction=False)
            for run_id in ids:
                pipe.hget(keys.run(tenant, run_id), "queue")
            for run_id, queue in zip(ids, pipe.execute(), strict=True):
                if subject.queue is None or text(queue) == subject.queue:
                    out.add((tenant, run_id, text(queue)))
    return sorted(out)


def _resumed_hold(c: Client, state: RunState | None, version: int) -> str:
    """The hold a resumed run's next step takes (a park gave the old one back)."""
    if state is None:
        return "-"
    return next_hold(c.ledger, c.config, state, c.jobs.get(state.job), version=version)


def requeue(c: Client, tenant: str, run_id: str, *, by: str, at: str) -> str:
    """Move one parked run back to running and send its step, exactly once: the version
    compare-and-set lets one caller win; a loser (another resume, a cancel) sends nothing.
    Returns "sent", "deferred" (committed, but the broker did not take the step: the pickup
    lease the commit set has the sweeper send it) or "skipped"."""
    stored = c.store.hash(tenant, run_id)
    if stored.get("status") != Status.PARKED.value:
        return "skipped"
    try:
        state: RunState | None = RunState.from_json(stored["state"])
    except StateFormatError:
        state = None  # the step will end the run `error`, saying why
    if state is not None:
        state.status = Status.RUNNING
    steps = state.usage.steps if state is not None else None
    committed = c.store.commit(
        Change(
            tenant=tenant, run_id=run_id, version=int(stored["version"]),
            old_status=Status.PARKED.value, status=Status.RUNNING.value,
            state_json=state.to_json().decode() if state is not None else "",
            lease_ms=int(c.config.pickup_lease_s * 1000),
            events=[{"type": "resumed", "by": by, "at": at, "step": steps}],
            hold=_resumed_hold(c, state, int(stored["version"]) + 1),
        )
    )  # fmt: skip
    if committed.kind != "ok":
        return "skipped"
    soft_s, hard_s = (
        time_limits(state, c.config) if state is not None else time_limits_default(c.config)
    )
    try:
        c.send(StepMessage(tenant, run_id, committed.version, stored["queue"]), soft_s, hard_s)
    except Exception:  # any failure of the broker client: the sweeper covers it
        return "deferred"
    return "sent"


def _requeue_pass(c: Client, subject: Subject, by: str, at: str, done: Resumed) -> None:
    cache: dict[str, bool] = {}
    held_back = 0
    for tenant, run_id, queue in parked_runs(c, subject):
        if not _gates_clear(c, tenant, queue, cache):
            held_back += 1
            continue
        sent = requeue(c, tenant, run_id, by=by, at=at)
        if sent != "skipped":
            done.resumed.append(run_id)
        if sent == "deferred":
            done.deferred.append(run_id)
    done.still_parked = held_back


def resume(c: Client, subject: Subject, *, by: str, settle_s: float = PARK_SETTLE_S) -> Resumed:
    """Clear the pause (and, for a queue, the drain) and re-enqueue each parked run of the subject
    whose other gates are clear, once. Resuming what is not paused changes nothing, as
    pausing what is paused does: `cleared` is empty and no run is touched."""
    check_known(c, subject)
    cleared = _clear_flags(c, subject)
    at = now_iso()
    done = Resumed(subject.kind, subject.name, by, at, cleared)
    if not cleared:
        return done
    c.client.hset(subject.flag_key, mapping={"resumed_at": at, "resumed_by": by})
    # A step that loaded its run before the flag was cleared is in flight until it parks;
    # wait for those (never longer than settle_s: a real turn does not park) and look again.
    pending = {run_id for _, run_id, _ in live_inflight(c, subject)}
    _requeue_pass(c, subject, by, at, done)
    deadline = time.monotonic() + settle_s
    while pending and time.monotonic() < deadline:
        time.sleep(0.05)
        pending &= {run_id for _, run_id, _ in live_inflight(c, subject)}
    _requeue_pass(c, subject, by, at, done)
    return done


# -- in flight, queues, drain --wait ----------------------------------------------------------


def live_inflight(c: Client, subject: Subject) -> list[tuple[str, str, str]]:
    """(tenant, run id, queue) of the turns in flight of the subject. An entry counts only while its
    own lease is in the future: a worker that died mid-turn leaves one behind."""
    now = server_ms(c.client)
    out = []
    for tenant in [subject.tenant] if subject.tenant is not None else tenants(c):
        entries = {text(k): text(v) for k, v in c.client.hgetall(keys.inflight(tenant)).items()}
        for run_id in sorted(entries):
            fields = entries[run_id].split("|")
            queue, lease = fields[0], fields[-1]
            if lease.isdigit() and int(lease) > now and subject.queue in (None, queue):
                out.append((tenant, run_id, queue))
    return out


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
    dead_letters: int | None = None  # entries workers could not take in (on a Redis broker)
    # Fair share: per tenant with steps waiting for the dispatcher on this queue or turns in
    # flight, {tenant, waiting (on this queue), in_flight (every queue), cap, weight}.
    tenants: list[dict[str, Any]] = field(default_factory=list)

    @property
    def pending(self) -> int:
        """Steps waiting in the tenants' pending lists for the dispatcher."""
        return sum(int(t["waiting"]) for t in self.tenants)


def _running_on(c: Client, queue: str) -> int:
    seen: set[tuple[str, str]] = set()
    for tenant in tenants(c):
        for ids in _scan(c, keys.by_status(tenant, "running")):
            pipe = c.client.pipeline(transaction=False)
            for run_id in ids:
                pipe.hget(keys.run(tenant, run_id), "queue")
            seen |= {
                (tenant, r) for r, q in zip(ids, pipe.execute(), strict=True) if text(q) == queue
            }
    return len(seen)


def queue_view(c: Client, queue: str) -> QueueView:
    check_known(c, Subject(queue=queue))
    paused, paused_by, draining, draining_by = (
        text(v)
        for v in c.client.hmget(
            keys.queue_control(queue), "paused", "paused_by", "draining", "draining_by"
        )
    )
    subject = Subject(queue=queue)
    return QueueView(
        queue,
        broker_depth(c.config.broker, queue),
        len(live_inflight(c, subject)),
        _running_on(c, queue),
        len(parked_runs(c, subject)),
        paused, paused_by, draining, draining_by,
        dead_letter_count(c.config.broker, queue),
        _fair_tenants(c, queue),
    )  # fmt: skip


def _fair_tenants(c: Client, queue: str) -> list[dict[str, Any]]:
    out = []
    for tenant in sorted(text(t) for t in c.client.smembers(keys.fair_active(queue))):
        view = fair.tenant_view(c.client, tenant, [queue])
        if view.waiting or view.in_flight:
            out.append(asdict(view))
    return out


def queues(c: Client) -> list[QueueView]:
    return [queue_view(c, text(q)) for q in sorted(c.client.smembers(keys.QUEUES))]


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


# -- decisions ------------------------------------------------------------------------------


def _decidable(run_id: str, stored: dict[str, str], verb: str) -> None:
    status = stored.get("status", "")
    if status == Status.STOPPED.value:
        raise DecisionRefusedError(
            f"run {run_id} already ended {stored.get('outcome') or 'stopped'}: "
            f"there is nothing to {verb}"
        )
    if verb != "cancel" and status != Status.SUSPENDED.value:
        raise DecisionRefusedError(
            f"run {run_id} is {status}, not suspended: it holds no call to {verb}"
        )


def approve(
    c: Client, run_id: str, *, by: str, digest: str | None = None, tenant: str | None = None
) -> RunState:
    """Approve exactly the held call: the one with `digest`, or the one held now."""
    tenant, stored = resolve(c, run_id, tenant)
    _decidable(run_id, stored, "approve")
    held = RunState.from_json(stored["state"]).pending
    return c.approve(run_id, by=by, digest=digest or (held.digest if held else None))


def deny(c: Client, run_id: str, *, by: str, reason: str, tenant: str | None = None) -> RunState:
    tenant, stored = resolve(c, run_id, tenant)
    _decidable(run_id, stored, "deny")
    return c.deny(run_id, by=by, reason=reason)


def cancel(c: Client, run_id: str, *, by: str, reason: str, tenant: str | None = None) -> str:
    """ "cancelled" (at once: no turn of the run is in flight) or "requested" (a turn is in
    flight: the run ends at its next turn boundary)."""
    tenant, stored = resolve(c, run_id, tenant)
    _decidable(run_id, stored, "cancel")
    return c.cancel(run_id, by=by, reason=reason)


# -- reading runs ---------------------------------------------------------------------------


def resolve(c: Client, run_id: str, tenant: str | None = None) -> tuple[str, dict[str, str]]:
    """The run's tenant and hash. Scoped to a tenant, a run of another tenant is not found."""
    if tenant is not None:
        stored = c.store.hash(tenant, run_id)
        if not stored:
            raise RunNotFoundError(f"no run {run_id!r} for tenant {tenant!r}")
        return tenant, stored
    return c.run_hash(run_id)


@dataclass(frozen=True)
class RunRow:
    run_id: str
    tenant: str
    status: str
    outcome: str
    detail: str
    queue: str
    job: str
    user: str
    created_ms: int
    updated_ms: int
    steps: int | None
    tokens: int | None
    cost_microusd: int | None
    reason: str = ""  # the outcome in words, beside its code and detail


def _row(tenant: str, run_id: str, stored: dict[str, str]) -> RunRow:
    usage: dict[str, Any] = {}
    with contextlib.suppress(StateFormatError, KeyError):
        usage = msgspec.to_builtins(RunState.from_json(stored["state"]).usage)
    return RunRow(
        run_id, tenant, stored.get("status", ""), stored.get("outcome", ""),
        stored.get("detail", ""), stored.get("queue", ""), stored.get("job", ""),
        stored.get("user", ""), int(stored.get("created_ms") or 0),
        int(stored.get("updated_ms") or 0), usage.get("steps"), usage.get("tokens"),
        usage.get("cost_microusd"), stored.get("reason", ""),
    )  # fmt: skip


def _check_filter(status: str | None, outcome: str | None) -> None:
    if status is not None and status not in {s.value for s in Status}:
        raise ControlError(
            f"unknown status {status!r}; one of {', '.join(s.value for s in Status)}"
        )
    if outcome is not None and outcome not in {o.value for o in Outcome}:
        raise ControlError(
            f"unknown outcome {outcome!r}; one of {', '.join(o.value for o in Outcome)}"
        )


Key = tuple[int, str, str]
"""A run's place in a listing: (created ms, tenant, run id). Listings are newest first, that
is in descending key order, across tenants."""
Bound = tuple[int, str]  # (created ms, run id) within one tenant: entries below it come next

PAGE_MAX = 10_000  # rows one page may ask for
SMALL_INDEX = 10_000
"""A filter's index up to this size (parked, suspended, running runs: the live ones) is read
whole in slices and sorted; a bigger one (stopped runs, an outcome) is walked in the tenant's
runs index instead, which such runs mostly fill."""
WALK_CHUNK = 200  # runs read per round trip on a walk
WALK_BUDGET = 5_000  # runs one page examines per tenant on a walk; then it may come back short
TOP_ID = "\U0010ffff"  # above every run id


@dataclass(frozen=True)
class RunsPage:
    """One page of a listing; `next_cursor` continues it, None when there is nothing more."""

    rows: list[RunRow]
    next_cursor: str | None


# url-safe base64, unpadded, of at most (ms, a tenant and a run id of 128 characters each, every
# one escaped to six in the JSON).
CURSOR = re.compile(r"[A-Za-z0-9_\-]{1,2200}")
MS_MAX = 2**53  # a creation time in ms, as a sorted set's score holds it exactly


def encode_cursor(key: Key) -> str:
    return base64.urlsafe_b64encode(msgspec.json.encode(list(key))).decode().rstrip("=")


def decode_cursor(text: str) -> Key:
    """The place a listing's `next_cursor` names, parsed strictly: url-safe base64 of JSON
    [ms, tenant, run id], the ms a whole number a score holds exactly, the names bounded."""
    bad = ControlError(f"bad cursor {text[:80]!r}: pass the next_cursor a listing gave")
    if not isinstance(text, str) or not CURSOR.fullmatch(text):
        raise bad
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        ms, tenant, run_id = msgspec.json.decode(raw, type=tuple[int, str, str], strict=True)
    except (ValueError, msgspec.DecodeError, msgspec.ValidationError):
        raise bad from None
    if not 0 <= ms <= MS_MAX or not 0 < len(tenant) <= 128 or not 0 < len(run_id) <= 128:
        raise bad
    return ms, tenant, run_id


def _bound(after: Key | None, tenant: str) -> Bound | None:
    """The first page of `tenant` after the global `after`, as a bound within the tenant."""
    if after is None:
        return None
    ms, cursor_tenant, run_id = after
    if tenant == cursor_tenant:
        return ms, run_id
    # Same created ms: a smaller tenant name comes later (all its ties are to come), a
    # bigger one earlier (none are).
    return (ms, TOP_ID) if tenant < cursor_tenant else (ms, "")


def _chunk(c: Client, tenant: str, bound: Bound | None, n: int) -> list[Bound]:
    """Up to n of the tenant's runs below `bound`, newest first, from its runs index."""
    key = keys.runs(tenant)
    if bound is None:
        raw: list[Any] = c.client.zrevrangebyscore(
            key, "+inf", "-inf", start=0, num=n, withscores=True
        )
        return [(int(score), text(m)) for m, score in raw]
    ms, run_id = bound
    ties = sorted((text(m) for m in c.client.zrangebyscore(key, ms, ms)), reverse=True)
    older: list[Any] = c.client.zrevrangebyscore(
        key, f"({ms}", "-inf", start=0, num=n, withscores=True
    )
    out = [(ms, m) for m in ties if m < run_id] + [(int(sc), text(m)) for m, sc in older]
    return out[:n]


def _members(c: Client, sets: list[str], ids: list[str]) -> list[bool]:
    """Whether each id is in every one of `sets`."""
    keep = [True] * len(ids)
    for key in sets:
        flags = c.client.smismember(key, ids) if ids else []
        keep = [k and bool(f) for k, f in zip(keep, flags, strict=True)]
    return keep


@dataclass
class _Found:
    entries: list[Key]  # matching runs of the tenant, newest first, at most the page's size
    stopped_at: Key | None = None  # a walk that ran out of budget: nothing below is known


def _walk(c: Client, tenant: str, sets: list[str], bound: Bound | None, want: int) -> _Found:
    found = _Found([])
    examined = 0
    while examined < WALK_BUDGET:
        chunk = _chunk(c, tenant, bound, WALK_CHUNK)
        if not chunk:
            return found
        keep = _members(c, sets, [r for _, r in chunk])
        for entry, matches in zip(chunk, keep, strict=True):
            bound = entry
            if matches:
                found.entries.append((entry[0], tenant, entry[1]))
                if len(found.entries) == want:
                    return found
        examined += len(chunk)
    if bound is not None:
        found.stopped_at = (bound[0], tenant, bound[1])
    return found


def _small(c: Client, tenant: str, sets: list[str], bound: Bound | None, want: int) -> _Found:
    """Read the smallest filter index whole (in slices) and order it by creation."""
    smallest, *others = sorted(sets, key=lambda k: int(c.client.scard(k)))
    ids = sorted({run_id for part in _scan(c, smallest) for run_id in part})
    ids = [r for r, k in zip(ids, _members(c, others, ids), strict=True) if k]
    scores = c.client.zmscore(keys.runs(tenant), ids) if ids else []
    entries = sorted(
        (
            (int(score), run_id)
            for run_id, score in zip(ids, scores, strict=True)
            if score is not None
        ),
        reverse=True,
    )
    below = [e for e in entries if bound is None or e < bound]
    return _Found([(ms, tenant, run_id) for ms, run_id in below[:want]])


def _filter_sets(tenant: str, status: str | None, outcome: str | None) -> list[str]:
    sets = [keys.by_status(tenant, status)] if status else []
    return sets + ([keys.by_outcome(tenant, outcome)] if outcome else [])


def _candidates(c: Client, tenant: str, sets: list[str], after: Key | None, want: int) -> _Found:
    bound = _bound(after, tenant)
    if sets and min(int(c.client.scard(k)) for k in sets) <= SMALL_INDEX:
        return _small(c, tenant, sets, bound, want)
    return _walk(c, tenant, sets, bound, want)


def page_runs(
    c: Client,
    *,
    tenant: str | None = None,
    status: str | None = None,
    outcome: str | None = None,
    limit: int = 100,
    cursor: str | None = None,
) -> RunsPage:
    """One page of runs, newest first: with a tenant, only that tenant's; without one, every
    tenant's (an operator's view). Reads at most `limit` runs per tenant from its indexes (a
    filtered walk through many finished runs examines at most WALK_BUDGET, and may return a
    short page), then loads only the page's runs. `cursor` is a page's `next_cursor`."""
    if tenant is not None:
        check_known(c, Subject(tenant=tenant))
    page, next_cursor = page_keys(
        c, tenant=tenant, status=status, outcome=outcome, limit=limit, cursor=cursor
    )
    return RunsPage(_rows(c, page), next_cursor)


def page_keys(
    c: Client,
    *,
    tenant: str | None,
    status: str | None,
    outcome: str | None,
    limit: int,
    cursor: str | None,
) -> tuple[list[Key], str | None]:
    """The places of a page's runs (exactly `limit` at most) and the cursor of the next page,
    without loading the runs. A tenant that has no runs has an empty page."""
    _check_filter(status, outcome)
    if not 1 <= limit <= PAGE_MAX:
        raise ControlError(f"limit must be between 1 and {PAGE_MAX}")
    after = decode_cursor(cursor) if cursor else None
    entries: list[Key] = []
    stops: list[Key] = []
    for t in [tenant] if tenant is not None else tenants(c):
        found = _candidates(c, t, _filter_sets(t, status, outcome), after, limit + 1)
        entries += found.entries
        stops += [found.stopped_at] if found.stopped_at else []
    entries.sort(reverse=True)
    # Below the newest place a walk stopped, that tenant's runs are not known yet.
    stop = max(stops, default=None)
    known = [e for e in entries if stop is None or e >= stop]
    page = known[:limit]
    # One more than the page was asked of each tenant: a page with nothing after it says so.
    next_key = page[-1] if len(known) > limit else stop
    return page, encode_cursor(next_key) if next_key else None


def _rows(c: Client, page: list[Key]) -> list[RunRow]:
    pipe = c.client.pipeline(transaction=False)
    for _, t, run_id in page:
        pipe.hgetall(keys.run(t, run_id))
    return [
        _row(t, run_id, {text(k): text(v) for k, v in raw.items()})
        for (_, t, run_id), raw in zip(page, pipe.execute(), strict=True)
        if raw
    ]


def events(c: Client, tenant: str, run_id: str) -> list[tuple[str, dict[str, Any]]]:
    return c.store.events(tenant, run_id)


def run_view(c: Client, run_id: str, tenant: str | None = None) -> dict[str, Any]:
    """Everything `turnstile status` shows about one run."""
    tenant, stored = resolve(c, run_id, tenant)
    state = RunState.from_json(stored["state"])
    stream = events(c, tenant, run_id)
    finished = next((e for _, e in reversed(stream) if e["type"] == "finished"), None)
    pending = None
    if state.pending is not None and stored.get("status") == Status.SUSPENDED.value:
        held = state.pending
        pending = {"tool": held.call.name, "args": held.call.args, "digest": held.digest,
                   "reason": held.reason}  # fmt: skip
    return {
        "run_id": run_id, "tenant": tenant, "status": stored.get("status", ""),
        "outcome": stored.get("outcome", ""), "detail": stored.get("detail", ""),
        "reason": stored.get("reason", ""), "queue": stored.get("queue", ""),
        "job": stored.get("job", ""), "user": stored.get("user", ""),
        "version": int(stored.get("version") or 0),
        "created_ms": int(stored.get("created_ms") or 0),
        "updated_ms": int(stored.get("updated_ms") or 0),
        "cancel_requested_by": stored.get("cancel_by", ""),
        "usage": msgspec.to_builtins(state.usage), "budget": msgspec.to_builtins(state.budget),
        "plan": [{"id": s.id, "tool": s.tool, "status": s.status} for s in state.plan],
        "pending": pending, "decisions": msgspec.to_builtins(state.decisions),
        "answer": state.answer, "message": finished.get("message") if finished else None,
        "last_result": state.last_result,
        "events": len(stream), "last_event": stream[-1][1]["type"] if stream else None,
    }  # fmt: skip


def follow(
    c: Client,
    tenant: str,
    run_id: str,
    *,
    timeout_s: float | None = None,
) -> Iterator[tuple[str, dict[str, Any]]]:
    """The run's events from the first, then live as they are appended, until the run stops
    (its `finished` event) or `timeout_s` passes: `Client.events`, as (id, event) pairs."""
    for event in c.events(run_id, tenant=tenant, timeout_s=timeout_s):
        yield event.id, event.data


# -- trace ----------------------------------------------------------------------------------


def spans(c: Client, run_id: str, tenant: str | None = None) -> tuple[str, list[Span]]:
    """The run's spans, turn by turn, as its turn events recorded them."""
    tenant, _ = resolve(c, run_id, tenant)
    out: list[Span] = []
    for _, event in events(c, tenant, run_id):
        if event["type"] == "turn":
            out += msgspec.convert(event.get("spans") or [], list[Span])
    return tenant, out
