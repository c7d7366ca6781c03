"""The run store: each run's state and version in Redis, its indexes and its event stream.

Three scripts do most of the writing: create (once per run), load (once per step: the state,
the attempt count, the lease and the gate flags in one round trip) and commit (every change a
run goes through, compare-and-set on the version, settling the ledger in the same script).
Two small ones take a hold mid-turn (hold) and record a cancel request (mark). Every hold a
run takes is recorded on the run, and the next commit settles or releases it: `leave` is the
one way out of a run (ended, parked or cancelled), for every caller.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, Protocol

import msgspec
import redis

from turnstile.errors import StoreUnavailableError
from turnstile.jobs.closing import closing_message, closing_without_state, recorded_steps
from turnstile.jobs.errors import StateFormatError, UnknownJobError
from turnstile.jobs.kernel import finish
from turnstile.jobs.outcomes import Outcome, Status
from turnstile.jobs.state import RunState
from turnstile.ledger import replies as ledger_replies
from turnstile.ledger.client import Ledger
from turnstile.ledger.results import ReserveResult
from turnstile.worker.registry import Jobs
from turnstile.worker.store import keys
from turnstile.worker.store.durability import WaitFor
from turnstile.worker.store.scripts import FAIR, LEDGER, RUN, evalsha, register, with_scripts
from turnstile.worker.store.values import UNAVAILABLE, is_cluster_client, text

HOST = socket.gethostname()
EVENTS_MAXLEN = 10_000  # per run; a run of this many events has long hit its step limit
PICKUP_LEASE_MS = 60_000  # TURNSTILE_PICKUP_LEASE_S's default; the callers pass theirs
CONVERSATION_TRIES = 20  # a release whose waiting list keeps changing under it gives up
REASON_MAX_CHARS = 500  # a stored reason is an excerpt: a message's arguments can be megabytes


class StoreUnavailable(StoreUnavailableError):  # noqa: N818 - the store is down, said plainly
    """The run store could not be reached, or none is configured; the caller retries later.
    Nothing was half-written."""


class NotDurableError(StoreUnavailable):
    """A write made but not confirmed where TURNSTILE_DURABILITY wants it (the disk, the
    replicas) in time: a crash of the server now may lose it. A step retries as if the store
    were down (its commit, if it survives, makes the retry a no-op); a caller is told."""


def inflight_tag(queue: str) -> str:
    """Where a turn runs, as its in-flight entry says: "<queue>|<pid>|<host>"."""
    return f"{queue}|{os.getpid()}|{HOST}"


def fingerprint(payload: Any) -> str:
    return hashlib.sha256(msgspec.json.encode(payload, order="sorted")).hexdigest()[:24]


def encode_event(event: dict[str, Any]) -> str:
    return msgspec.json.encode(event, order="sorted").decode()


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def excerpt(text: str, limit: int = REASON_MAX_CHARS) -> str:
    """At most `limit` characters of `text`, saying how much was cut."""
    if len(text) <= limit:
        return text
    return f"{text[: limit - 40]}... ({len(text) - limit + 40} more characters)"


@dataclass(frozen=True)
class Joining:
    """A submission to a conversation, as run_create.lua takes it: the key, the policy, what
    the caller read of the conversation (its active run and where a follow-up goes), the run's
    state as a waiting one, and, for a merge, the follow-up and its event."""

    key: str
    policy: str
    active: str = ""
    target: str = ""
    waiting_state: str = ""
    followup: str = ""  # JSON
    event: dict[str, Any] = field(default_factory=dict)  # on the target (merge) or the active
    idempotent: bool = False
    max_followups: int = 50


@dataclass(frozen=True)
class Joined:
    """What run_create.lua did with a conversation's submission (see its Returns)."""

    kind: Literal["created", "exists", "busy", "waiting", "interrupting", "merged", "moved",
                  "full"]  # fmt: skip
    active: str = ""  # the active run the reply names
    target: str = ""  # merged: the run the follow-up went to; moved: where it would go now
    again: bool = False  # merged before, by the same idempotent submission
    fingerprint: str = ""  # exists: the stored submission's


@dataclass(frozen=True)
class Loaded:
    kind: Literal["missing", "stale", "idle", "busy", "go"]
    version: int = 0
    status: str = ""
    state: str = ""
    attempts: int = 0
    tenant_paused: bool = False
    cancel_by: str = ""
    cancel_reason: str = ""
    queue_paused: bool = False
    queue_draining: bool = False
    hold: str = "none"  # what became of the next turn's ledger hold; see run_load.lua
    hold_reply: Any = ""  # ledger_reserve's reply, or the unfit dimension
    hold_id: str = ""  # the reservation id, when the load took a hold
    gap_ms: int = 0  # since the run last changed: for a continuing run, since its commit
    supersede_by: str = ""  # a run of its conversation that interrupts it (see run_create.lua)
    followups: str = ""  # JSON list: messages merged into the run that no turn has seen yet


@dataclass
class Change:
    """One commit: everything a run's hash, indexes, lease, stream and ledger will get."""

    tenant: str
    run_id: str
    version: int  # the version the caller loaded
    old_status: str
    status: str
    state_json: str = ""  # "" keeps the stored state
    outcome: str = ""
    detail: str = ""
    reason: str = ""
    lease_ms: int | None = None  # None drops the lease
    events: list[dict[str, Any]] = field(default_factory=list)
    settlements: list[list[str]] = field(default_factory=list)  # ledger_settle ARGV each
    clear: list[str] = field(default_factory=list)  # run-hash fields to delete
    hold: str = ""  # the next turn's ledger hold: "" keeps the stored one, "-" drops it
    if_idle: bool = False  # commit only if no turn of the run is in flight ("busy" otherwise)
    next_step: NextStep | None = None  # queued by the commit itself (fair share, see fair.py)
    claim: Claim | None = None  # or claimed for this worker, where fair share allows (eager)
    followups_seen: int = 0  # merged messages this change consumed (the first n waiting)
    conversation: str = ""  # the run's conversation: a stopping commit releases it


class NextStep(Protocol):
    """A run's next step as its tenant's pending list takes it (`Pending` in
    worker/scheduling/fair.py)."""

    @property
    def keys(self) -> list[str]: ...  # the pending list, the pending index, the slots

    @property
    def entry(self) -> str: ...

    @property
    def before(self) -> str: ...  # the slot the step before gives back

    def announce(self, pipe: Any) -> None: ...  # in the same pipeline, after the entry


@dataclass(frozen=True)
class Claim:
    """What a commit needs to claim the run's next step for its worker instead of queueing it
    (eager continuation, see run_commit.lua): the keys fair share's check reads, and the
    claimed delivery's load arguments (built by worker/scheduling/fair.py `claim`)."""

    keys: list[str]  # tenant control, caps, queue control, fair_active, fair_sent, queues, wake
    args: list[str]  # tenant, in-flight lease, where, token, sent window, slot lease, queue
    # On a cluster, the queue's part of the check, read before the commit (the queue's keys
    # are in no tenant's slot; `keys` then holds the tenant's two only): False, no claim.
    queue_allows: Callable[[Any], bool] | None = None


@dataclass(frozen=True)
class Committed:
    kind: Literal["ok", "stale", "missing", "ledger", "busy", "moved"]
    version: int = 0
    detail: str = ""
    queued: bool = False  # the commit queued the run's next step (`Change.next_step`)
    claimed: Loaded | None = None  # or claimed it, and loaded it for this worker (`claim`)
    started: Started | None = None  # the run of its conversation that this commit started


@dataclass(frozen=True)
class Started:
    """A waiting run of a conversation that a stopping commit made active: its first step is
    the caller's to send (its lease makes the sweeper send it otherwise)."""

    tenant: str
    run_id: str
    queue: str
    state: str


def loaded_from(reply: Any, version: int, queue_flags: Any) -> Loaded:
    """run_load.lua's reply (or an eager commit's load of the step it claimed, whose queue
    flags its check read: `queue_flags` None) as a Loaded."""
    kind = text(reply[0])
    if kind == "missing":
        return Loaded("missing")
    if kind in ("stale", "idle", "busy"):
        return Loaded(kind, version=int(reply[1]), status=text(reply[2]))  # type: ignore[arg-type]
    paused, draining = queue_flags if queue_flags is not None else ("", "")
    return Loaded(
        "go",
        version=version,
        status=text(reply[6]),
        state=text(reply[1]),
        attempts=int(reply[2]),
        tenant_paused=bool(text(reply[3])),
        cancel_by=text(reply[4]),
        cancel_reason=text(reply[5]),
        queue_paused=bool(text(paused)),
        queue_draining=bool(text(draining)),
        hold=text(reply[7]),
        hold_reply=reply[8],
        hold_id=text(reply[9]),
        gap_ms=int(reply[10]),
        supersede_by=text(reply[11]) if len(reply) > 11 else "",
        followups=text(reply[12]) if len(reply) > 12 else "",
    )


def committed_from(reply: Any, change: Change) -> Committed:
    """run_commit.lua's reply as a Committed."""
    kind = text(reply[0])
    if kind == "ok":
        if len(reply) == 4:  # claimed: the step's load, as run_load.lua would reply
            claimed = loaded_from(reply[3], int(reply[1]), None)
            return Committed("ok", version=int(reply[1]), claimed=claimed)
        if len(reply) > 4:  # a waiting run of the conversation started
            started = Started(change.tenant, text(reply[3]), text(reply[4]), text(reply[5]))
            return Committed("ok", version=int(reply[1]), started=started)
        return Committed("ok", version=int(reply[1]), queued=change.next_step is not None)
    if kind in ("stale", "busy"):
        return Committed(kind, version=int(reply[1]))  # type: ignore[arg-type]
    if kind in ("ledger", "moved"):  # moved: the first waiting run of the conversation now
        said = " ".join(text(part) for part in reply[1:]).strip()
        return Committed(kind, detail=said)  # type: ignore[arg-type]
    return Committed("missing")


def _create_keys(tenant: str, run_id: str) -> list[str]:
    """run_create.lua's KEYS 1-5, every run's (a run of a conversation adds KEYS 6-11)."""
    return [
        keys.run(tenant, run_id),
        keys.events(tenant, run_id),
        keys.runs(tenant),
        keys.by_status(tenant, "running"),
        keys.leases(tenant),
    ]


class RunStore:
    def __init__(
        self,
        client: redis.Redis,
        ledger: Ledger,
        *,
        wait_for: WaitFor | None = None,
        jobs: Jobs | None = None,
        pickup_lease_ms: int = PICKUP_LEASE_MS,
    ) -> None:
        self.client = client
        self.ledger = ledger
        self.pickup_lease_ms = pickup_lease_ms  # a conversation's next run's, when it starts
        # Sends the first step of a conversation's run that a commit started (set by the
        # store's owner: the client, a worker's services); without one the sweeper sends it.
        self.on_started: Callable[[Started], None] | None = None
        self.wait_for = wait_for or WaitFor()  # what a create or a commit reaches first
        self.cluster = is_cluster_client(client)
        self._create = register(client, "run_create")
        self._load = register(client, "run_load", LEDGER, RUN)
        self._renew = register(client, "run_renew")
        self._commit = register(client, "run_commit", LEDGER, FAIR, RUN)
        self._hold = register(client, "run_hold", LEDGER)
        self._mark = register(client, "run_mark")
        # For closing messages: the process's registry, passed in; built here only for a store
        # made on its own (a test, a tool).
        self.jobs = jobs if jobs is not None else Jobs(client)

    # -- writing ---------------------------------------------------------------------------

    def _pipeline(self, build: Callable[[Any], None]) -> list[Any]:
        """Run a pipeline that calls this store's scripts by their sha (see `with_scripts`);
        its other commands are reads and idempotent adds."""
        try:
            return with_scripts(self.client, (self._create, self._load, self._commit), build)
        except UNAVAILABLE as exc:
            raise StoreUnavailable(f"store unavailable: {exc}") from exc

    def create(
        self,
        *,
        tenant: str,
        run_id: str,
        state_json: str,
        fingerprint: str,
        queue: str,
        job: str,
        user_id: str,
        pickup_lease_ms: int,
        event: dict[str, Any],
        hold: str,
        priority: int,
    ) -> tuple[bool, str]:
        """Create the run once, with its priority (0-9, see scheduling/priority.py). Returns
        (created, stored fingerprint)."""
        run_keys = _create_keys(tenant, run_id)
        args = [
            run_id, state_json, fingerprint, queue, job, user_id,
            pickup_lease_ms, encode_event(event), EVENTS_MAXLEN, hold, priority,
        ]  # fmt: skip

        def build(pipe: Any) -> None:
            # The tenant first: it is the sweeper's way to the run. A submission refused here
            # is one of a run the tenant already has, so this adds nothing then.
            pipe.sadd(keys.TENANTS, tenant)
            evalsha(pipe, self._create, run_keys, args)

        reply = self._durable(
            build, f"the submission of run {run_id} was written but", self._create
        )[-1]
        created = text(reply[0]) == "created"
        stored = fingerprint if created else text(reply[1])
        if stored == fingerprint:
            # The queue joins the index only once the run is there: a submission refused by
            # the script (another one of the same id won a race with it) adds no queue. A
            # crash before this line costs the index the name until the next submission to
            # the queue (or this one retried), never a run.
            try:
                self.client.sadd(keys.QUEUES, queue)
            except UNAVAILABLE as exc:
                raise StoreUnavailable(f"store unavailable: {exc}") from exc
        return created, stored

    def join(
        self,
        *,
        tenant: str,
        run_id: str,
        state_json: str,
        fingerprint: str,
        queue: str,
        job: str,
        user_id: str,
        pickup_lease_ms: int,
        event: dict[str, Any],
        hold: str,
        priority: int,
        joining: Joining,
    ) -> Joined:
        """Create a run of a conversation, or apply its policy to the conversation's active run,
        in one script (run_create.lua): at most one run of a conversation is ever active."""
        run_keys = [
            *_create_keys(tenant, run_id),
            keys.conversation(tenant, joining.key),
            keys.conversation_waiting(tenant, joining.key),
            keys.run(tenant, joining.active or run_id),
            keys.run(tenant, joining.target or joining.active or run_id),
            keys.events(tenant, joining.target or joining.active or run_id),
            keys.by_status(tenant, "waiting"),
        ]
        args = [
            run_id, state_json, fingerprint, queue, job, user_id,
            pickup_lease_ms, encode_event(event), EVENTS_MAXLEN, hold, priority,
            joining.key, joining.policy, joining.active, joining.target, joining.waiting_state,
            joining.followup, encode_event(joining.event) if joining.event else "",
            "1" if joining.idempotent else "", joining.max_followups,
        ]  # fmt: skip

        def build(pipe: Any) -> None:
            pipe.sadd(keys.TENANTS, tenant)
            evalsha(pipe, self._create, run_keys, args)

        reply = self._durable(
            build, f"the submission of run {run_id} was written but", self._create
        )[-1]
        kind = text(reply[0])
        if kind in ("created", "waiting", "interrupting"):
            try:
                self.client.sadd(keys.QUEUES, queue)
            except UNAVAILABLE as exc:
                raise StoreUnavailable(f"store unavailable: {exc}") from exc
        if kind == "created":
            return Joined("created")
        if kind == "exists":
            return Joined("exists", fingerprint=text(reply[1]))
        if kind in ("busy", "waiting", "interrupting"):
            return Joined(kind, active=text(reply[1]))  # type: ignore[arg-type]
        if kind == "merged":
            return Joined("merged", target=text(reply[1]), again=text(reply[2]) == "1")
        if kind == "moved":
            return Joined("moved", active=text(reply[1]), target=text(reply[2]))
        return Joined("full", target=text(reply[1]))

    def load(
        self,
        *,
        tenant: str,
        run_id: str,
        version: int,
        queue: str,
        inflight_lease_ms: int,
        delivery: str,
        after: str = "",
    ) -> Loaded:
        """The step's one read: gate, state and the next turn's ledger hold, in one script,
        pipelined with the queue's flags. `delivery` names this delivery; `after` the earlier
        delivery of the step that exited cleanly (see run_load.lua: it does not count as an
        attempt)."""
        script_keys = [
            keys.run(tenant, run_id),
            keys.leases(tenant),
            keys.control(tenant),
            keys.inflight(tenant),
            *keys.ledger(tenant),
        ]
        args = [run_id, version, inflight_lease_ms, inflight_tag(queue), delivery, after]

        def build(pipe: Any) -> None:
            evalsha(pipe, self._load, script_keys, args)
            pipe.hmget(keys.queue_control(queue), "paused", "draining")
            # Loaded: no longer a step waiting on the broker (see keys.fair_sent).
            pipe.zrem(keys.fair_sent(queue), f"{tenant}|{run_id}:{version}")

        reply, flags, _ = self._pipeline(build)
        return loaded_from(reply, version, flags)

    def renew(self, *, tenant: str, run_id: str, queue: str, lease_ms: int) -> bool:
        """Extend a running turn's in-flight lease; False once it is not in flight here."""
        reply = self._renew(
            keys=[keys.leases(tenant), keys.inflight(tenant)],
            args=[run_id, inflight_tag(queue), lease_ms],
        )
        return bool(reply)

    def hold(self, tenant: str, run_id: str, version: int, argv: list[str]) -> ReserveResult | None:
        """Take a ledger hold for the turn of `version` and record it on the run (see
        run_hold.lua); None when the run moved on, so no hold was taken."""
        script_keys = [keys.run(tenant, run_id), *keys.ledger(tenant)]
        try:
            reply = self._hold(keys=script_keys, args=[version, *argv])
        except UNAVAILABLE as exc:
            return ReserveResult(status="unavailable", admitted=False, detail=str(exc))
        if text(reply[0]) == "stale":
            return None
        if ledger_replies.needs_index(reply):
            self.ledger.index_tenant(tenant)
        return ledger_replies.reserve(reply)

    def mark(
        self,
        tenant: str,
        run_id: str,
        *,
        version: int,
        status: str,
        fields: dict[str, str],
        event: dict[str, Any],
    ) -> Committed:
        """Set fields a later step acts on, compare-and-set on the version and the status,
        without moving the run on (see run_mark.lua)."""
        args: list[Any] = [version, status, EVENTS_MAXLEN, encode_event(event)]
        for name, value in fields.items():
            args += [name, value]
        try:
            reply = self._mark(keys=[keys.run(tenant, run_id), keys.events(tenant, run_id)],
                               args=args)  # fmt: skip
        except UNAVAILABLE as exc:
            raise StoreUnavailable(f"store unavailable: {exc}") from exc
        kind = text(reply[0])
        if kind == "ok":
            return Committed("ok", version=int(reply[1]))
        if kind == "stale":
            return Committed("stale", version=int(reply[1]), detail=text(reply[2]))
        return Committed("missing")

    def commit(self, change: Change) -> Committed:
        """Commit one change (run_commit.lua). A stopping commit of a run of a conversation
        names the conversation's first waiting run as it read it; when another came first in
        between (an interrupt), it reads again and commits again (nothing was written)."""
        head = ""
        for _ in range(CONVERSATION_TRIES):
            if change.conversation and change.status == Status.STOPPED.value:
                head = self._first_waiting(change.tenant, change.conversation)
            committed = self._commit_once(change, head)
            if committed.started is not None and self.on_started is not None:
                self.on_started(committed.started)
            if committed.kind != "moved":
                return committed
        return Committed("moved", detail="the conversation's waiting runs kept changing")

    def _first_waiting(self, tenant: str, conversation: str) -> str:
        try:
            first = self.client.lindex(keys.conversation_waiting(tenant, conversation), 0)
        except UNAVAILABLE as exc:
            raise StoreUnavailable(f"store unavailable: {exc}") from exc
        return text(first) if first is not None else ""

    def _commit_once(self, change: Change, head: str) -> Committed:
        tenant = change.tenant
        outcome_key = keys.by_outcome(tenant, change.outcome or "none")
        script_keys = [
            keys.run(tenant, change.run_id),
            keys.events(tenant, change.run_id),
            keys.leases(tenant),
            keys.by_status(tenant, change.old_status),
            keys.by_status(tenant, change.status),
            outcome_key,
            keys.inflight(tenant),
        ]
        args: list[Any] = [
            change.run_id,
            change.version,
            change.state_json,
            change.status,
            change.outcome,
            change.detail,
            change.reason,
            "" if change.lease_ms is None else change.lease_ms,
            EVENTS_MAXLEN,
            len(change.events),
            *(encode_event(e) for e in change.events),
            len(change.settlements),
        ]
        for settlement in change.settlements:
            args += [len(settlement), *settlement]
        script_keys += keys.ledger(tenant)  # every commit closes the run's open holds
        _, release = self.ledger.settle_script_args(tenant, change.run_id, {})
        args += [len(change.clear), *change.clear, change.hold, "1" if change.if_idle else ""]
        args.append(release[1])  # the ledger's journal length, for the releases
        self._conversation_args(change, head, script_keys, args)
        then = None
        announce_after = False  # on a cluster, a claim that queued after all is announced here
        if change.next_step is not None:
            script_keys += change.next_step.keys
            args += [change.next_step.entry, change.next_step.before]
            then = change.next_step.announce
            claim = self._claim_asked(change.claim)
            if claim is not None:  # the script announces a step it queues after all
                script_keys += claim.keys
                args += claim.args
                then = None
                announce_after = claim.queue_allows is not None
            if then is not None and self.cluster:
                # The entry, then its announcement, in that order (see fair.Pending.announce):
                # a cluster's pipeline sends the two to their nodes in no set order.
                then, announce_after = None, True
        try:
            reply = self._durable_call(
                self._commit,
                script_keys,
                args,
                f"the change to run {change.run_id} was written but",
                then=then,
            )
        except UNAVAILABLE as exc:
            raise StoreUnavailable(f"store unavailable: {exc}") from exc
        if announce_after and text(reply[0]) == "ok" and len(reply) <= 3:
            self._announce(change.next_step)
        return committed_from(reply, change)

    def _conversation_args(
        self, change: Change, head: str, script_keys: list[str], args: list[Any]
    ) -> None:
        """The commit's follow-ups and, for a stopping run of a conversation, its release's
        keys (at the end of KEYS: a stopping commit queues no next step) and arguments."""
        tenant = change.tenant
        releases = bool(change.conversation) and change.status == Status.STOPPED.value
        args += [change.followups_seen, len(script_keys) + 1 if releases else "", head,
                 self.pickup_lease_ms]  # fmt: skip
        args.append(
            encode_event({"type": "started", "after": change.run_id,
                          "conversation": change.conversation, "at": now_iso()})
            if releases and head else ""
        )  # fmt: skip
        if releases:
            script_keys += [
                keys.conversation(tenant, change.conversation),
                keys.conversation_waiting(tenant, change.conversation),
                keys.run(tenant, head or change.run_id),
                keys.events(tenant, head or change.run_id),
                keys.by_status(tenant, Status.WAITING.value),
                keys.by_status(tenant, Status.RUNNING.value),
            ]

    def _claim_asked(self, claim: Claim | None) -> Claim | None:
        """The claim to ask the commit for: on a cluster, only if the queue's part of the
        check, read first, allows it (see run_commit.lua, "Cluster")."""
        if claim is None or claim.queue_allows is None:
            return claim
        try:
            return claim if claim.queue_allows(self.client) else None
        except UNAVAILABLE:
            return None  # the commit itself says whether the store is there

    def _announce(self, step: NextStep | None) -> None:
        """On a cluster, a step the commit queued, announced after the reply. A crash before
        this leaves the step in its pending list unannounced: its lease lapses and the sweeper
        sends it again, which announces it."""
        if step is None:
            return
        with contextlib.suppress(*UNAVAILABLE):
            pipe = self.client.pipeline(transaction=False)
            step.announce(pipe)
            pipe.execute()

    # -- leaving ---------------------------------------------------------------------------

    def leave(
        self,
        *,
        tenant: str,
        run_id: str,
        version: int,
        old_status: str,
        state: RunState | None,
        reason: str = "",
        events: Sequence[dict[str, Any]] = (),
        settlements: Sequence[list[str]] = (),
        clear: Sequence[str] = (),
        if_idle: bool = False,
        at: str = "",
        followups_seen: int = 0,
    ) -> Committed:
        """The one way out of a run: every path that ends, parks or cancels a run commits here.

        `state` is the run as it leaves: stopped with its outcome, or parked (`reason` says
        why); None for a state that does not parse, which ends the run `error` with `reason`
        and keeps the stored state as it is. The commit settles `settlements` and releases
        every other hold the run still has open; a run that stops gets its one `finished`
        event, with the closing message built from the state and from what the job's systems
        of record say was done."""
        at = at or now_iso()
        out = list(events)
        if state is None:
            status, outcome, detail = Status.STOPPED.value, Outcome.ERROR.value, ""
            reason = excerpt(reason)
            out.append(self._finished(None, reason, at))
        elif state.status is Status.STOPPED:
            state.reason = excerpt(state.reason or "")
            status, reason = state.status.value, state.reason
            outcome, detail = (state.outcome or Outcome.ERROR).value, state.detail or ""
            out.append(self._finished(state, reason, at))
        elif state.status is Status.PARKED:
            status, outcome, detail = state.status.value, "", ""
        else:
            raise ValueError(f"a run leaves stopped or parked, not {state.status.value}")
        conversation = (
            state.conversation or "" if state is not None else self._field(tenant, run_id,
                                                                           "conversation")
        )  # fmt: skip
        return self.commit(
            Change(
                tenant=tenant, run_id=run_id, version=version, old_status=old_status,
                status=status, state_json=state.to_json().decode() if state is not None else "",
                outcome=outcome, detail=detail, reason=reason, lease_ms=None, events=out,
                settlements=list(settlements), clear=list(clear), hold="-", if_idle=if_idle,
                followups_seen=followups_seen, conversation=conversation,
            )
        )  # fmt: skip

    def _field(self, tenant: str, run_id: str, name: str) -> str:
        try:
            value = self.client.hget(keys.run(tenant, run_id), name)
        except UNAVAILABLE as exc:
            raise StoreUnavailable(f"store unavailable: {exc}") from exc
        return text(value) if value is not None else ""

    def _finished(self, state: RunState | None, reason: str, at: str) -> dict[str, Any]:
        """A stopped run's one `finished` event, with its closing message."""
        if state is None:
            return {"type": "finished", "outcome": Outcome.ERROR.value, "detail": None,
                    "reason": reason, "answer": None, "usage": None, "at": at,
                    "message": closing_without_state(Outcome.ERROR)}  # fmt: skip
        outcome = state.outcome or Outcome.ERROR
        try:
            job = self.jobs.get(state.job)
        except UnknownJobError:
            message = closing_without_state(outcome)
        else:
            message = closing_message(state, job, recorded=recorded_steps(state, job))
        return {
            "type": "finished", "outcome": outcome.value, "detail": state.detail,
            "reason": reason, "answer": state.answer, "message": message,
            "usage": msgspec.to_builtins(state.usage), "at": at,
        }  # fmt: skip

    def fail_run(self, tenant: str, run_id: str, reason: str, *, at: str = "") -> Committed:
        """End a live run `error` with the reason, from whatever its hash holds: the state is
        updated when it parses and kept as it is when it does not. Its open holds are
        released, as on every way out."""
        stored = self.hash(tenant, run_id)
        if not stored:
            return Committed("missing")
        if stored.get("status") == Status.STOPPED.value:
            return Committed("stale", version=int(stored["version"]))
        state: RunState | None = None
        try:
            state = RunState.from_json(stored.get("state", ""))
            finish(state, Outcome.ERROR, excerpt(reason))
        except StateFormatError:
            state = None
        return self.leave(
            tenant=tenant, run_id=run_id, version=int(stored["version"]),
            old_status=stored.get("status", "running"), state=state, reason=reason, at=at,
        )  # fmt: skip

    # -- durability: a wrapper around the writing script calls ------------------------------

    def _durable_call(
        self,
        script: Any,
        script_keys: list[str],
        args: list[Any],
        what: str,
        *,
        then: Callable[[Any], None] | None = None,
    ) -> Any:
        """Call a writing script, and `then` add its commands to the same round trip; unless
        durability is `none`, wait for the write to reach the disk or the replicas first (see
        worker/store/durability.py). Returns the script's reply."""
        if not self.wait_for.waits and then is None:
            return script(keys=script_keys, args=args)

        def build(pipe: Any) -> None:
            evalsha(pipe, script, script_keys, args)
            if then is not None:
                then(pipe)

        return self._durable(build, what, script)[0]

    def fence(self, what: str = "what was read is") -> None:
        """Wait until everything this client has read is where TURNSTILE_DURABILITY wants a
        write (a no-op for `none`), so an observer is never shown what a crash could take back.
        WAITAOF and WAIT wait for the connection's own writes, so the reader makes one (a
        counter): it comes after every write it read, and the disk and the replicas take
        writes in order."""
        if self.wait_for.waits:
            self._durable(lambda pipe: pipe.incr(keys.FENCE), what, None)

    def _durable(self, build: Callable[[Any], None], what: str, script: Any) -> list[Any]:
        """The pipeline `build` makes, then (durability not `none`) the wait, on the same
        connection and in the same round trip: WAITAOF and WAIT wait for this connection's own
        writes. Raises NotDurableError when the wait times out, the server cannot wait, or
        (`aof`) its fsync policy cannot back the wait's answer."""
        if not self.wait_for.waits:
            return self._pipeline(build)
        waits = self.wait_for.commands()

        def build_and_wait(pipe: Any) -> None:
            build(pipe)
            for command in waits:
                pipe.execute_command(*command)

        try:
            replies = with_scripts(
                self.client, (script,) if script else (), build_and_wait, raise_on_error=False
            )
        except UNAVAILABLE as exc:
            raise StoreUnavailable(f"store unavailable: {exc}") from exc
        written, waited = replies[: -len(waits)], replies[-len(waits) :]
        for reply in written:
            if isinstance(reply, Exception):
                raise reply
        for reply in waited:
            if isinstance(reply, Exception):
                raise NotDurableError(f"{what} cannot be confirmed: {reply}")
        shortfall = self.wait_for.shortfall(waited, what)
        if shortfall:
            raise NotDurableError(shortfall)
        return written

    def _execute(self, pipe: Any) -> list[Any]:
        try:
            return list(pipe.execute())
        except UNAVAILABLE as exc:
            raise StoreUnavailable(f"store unavailable: {exc}") from exc

    # -- reading ---------------------------------------------------------------------------

    def hash(self, tenant: str, run_id: str) -> dict[str, str]:
        try:
            raw = self.client.hgetall(keys.run(tenant, run_id))
        except UNAVAILABLE as exc:
            raise StoreUnavailable(f"store unavailable: {exc}") from exc
        return {text(k): text(v) for k, v in raw.items()}

    def events(
        self, tenant: str, run_id: str, *, after: str = "-", count: int | None = None
    ) -> list[tuple[str, dict[str, Any]]]:
        start = after if after == "-" else f"({after}"
        entries: list[Any] = self.client.xrange(  # type: ignore[assignment]
            keys.events(tenant, run_id), min=start, count=count
        )
        return [(text(eid), msgspec.json.decode(text(fields["event"]))) for eid, fields in entries]
