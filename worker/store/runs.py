"""The run store: each run's state and version in Redis, its indexes and its event stream.

Three scripts do most of the writing: create (once per run), load (once per step: the state,
the attempt count, the lease and the gate flags in one round trip) and commit (every change a
run goes through, compare-and-set on the version, settling the ledger in the same script).
Two small ones take a hold mid-turn (hold) and record a cancel request (mark). Every hold a
run takes is recorded on the run, and the next commit settles or releases it: `leave` is the
one way out of a run (ended, parked or cancelled), for every caller.

What the scripts are given and answer are values of records.py; their KEYS and ARGV are built
by run_calls.py (pure); the closing message of a run that stops is built by jobs/closing.py.
This module only sends them, with the durability wait (durability.py) where one is asked for.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import msgspec
import redis

from turnstile.jobs.closing import finished_event, recorded_steps
from turnstile.jobs.errors import StateFormatError, UnknownJobError
from turnstile.jobs.kernel import finish
from turnstile.jobs.outcomes import Outcome, Status
from turnstile.jobs.state import RunState
from turnstile.ledger import replies as ledger_replies
from turnstile.ledger.client import Ledger
from turnstile.ledger.results import ReserveResult
from turnstile.worker.registry import Jobs
from turnstile.worker.store import fields, keys, pending
from turnstile.worker.store.controls import DRAINING, PAUSED
from turnstile.worker.store.durability import WaitFor, written
from turnstile.worker.store.errors import NotDurableError, StoreUnavailable, reached
from turnstile.worker.store.records import (
    Change,
    Claim,
    Committed,
    InFlight,
    Joined,
    Joining,
    Loaded,
    NextStep,
    Started,
    committed_from,
    created_from,
    joined_from,
    loaded_from,
    marked_from,
)
from turnstile.worker.store.run_calls import (
    EVENTS_MAXLEN,
    HOST,
    commit_call,
    create_call,
    encode_event,
    hold_call,
    inflight_tag,
    join_call,
    load_call,
    mark_call,
    packed,
    renew_call,
    sent_member,
)
from turnstile.worker.store.scripts import (
    FAIR,
    LEDGER,
    RUN,
    ScriptCall,
    call_script,
    evalsha,
    register,
    with_scripts,
)
from turnstile.worker.store.values import (
    REASON_MAX_CHARS,
    UNAVAILABLE,
    excerpt,
    fingerprint,
    is_cluster_client,
    now_iso,
    text,
)

# What other packages import from here, wherever it is defined now.
__all__ = [
    "CONVERSATION_TRIES", "EVENTS_MAXLEN", "HOST", "PICKUP_LEASE_MS", "REASON_MAX_CHARS",
    "Change", "Claim", "Committed", "Joined", "Joining", "Loaded", "NextStep",
    "NotDurableError", "RunStore", "Started", "StoreUnavailable", "committed_from",
    "encode_event", "excerpt", "fingerprint", "inflight_tag", "loaded_from", "now_iso",
]  # fmt: skip

PICKUP_LEASE_MS = 60_000  # TURNSTILE_PICKUP_LEASE_S's default; the callers pass theirs
CONVERSATION_TRIES = 20  # a release whose waiting list keeps changing under it gives up


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

    @reached()
    def _pipeline(self, build: Callable[[Any], None]) -> list[Any]:
        """Run a pipeline that calls this store's scripts by their sha (see `with_scripts`);
        its other commands are reads and idempotent adds."""
        return with_scripts(self.client, (self._create, self._load, self._commit), build)

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
        call = create_call(
            tenant=tenant, run_id=run_id, state_json=state_json, fingerprint=fingerprint,
            queue=queue, job=job, user_id=user_id, pickup_lease_ms=pickup_lease_ms,
            event=event, hold=hold, priority=priority,
        )  # fmt: skip
        created, stored = created_from(self._submit(tenant, run_id, call), fingerprint)
        if stored == fingerprint:
            # The queue joins the index only once the run is there: a submission refused by
            # the script (another one of the same id won a race with it) adds no queue. A
            # crash before this line costs the index the name until the next submission to
            # the queue (or this one retried), never a run.
            self._index_queue(queue)
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
        call = join_call(
            tenant=tenant, run_id=run_id, state_json=state_json, fingerprint=fingerprint,
            queue=queue, job=job, user_id=user_id, pickup_lease_ms=pickup_lease_ms,
            event=event, hold=hold, priority=priority, joining=joining,
        )  # fmt: skip
        joined = joined_from(self._submit(tenant, run_id, call))
        if joined.kind in ("created", "waiting", "interrupting"):
            self._index_queue(queue)
        return joined

    def _submit(self, tenant: str, run_id: str, call: ScriptCall) -> Any:
        """run_create.lua's call, after the tenant joins the index (it is the sweeper's way to
        the run; a submission refused by the script is one of a run the tenant already has,
        so this adds nothing then); the script's reply."""

        def build(pipe: Any) -> None:
            pipe.sadd(keys.TENANTS, tenant)
            evalsha(pipe, self._create, call.keys, call.args)

        return self._durable(
            build, f"the submission of run {run_id} was written but", self._create
        )[-1]

    @reached()
    def _index_queue(self, queue: str) -> None:
        self.client.sadd(keys.QUEUES, queue)

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
        call = load_call(
            tenant=tenant, run_id=run_id, version=version, inflight_lease_ms=inflight_lease_ms,
            where=inflight_tag(queue), delivery=delivery, after=after,
        )  # fmt: skip

        def build(pipe: Any) -> None:
            evalsha(pipe, self._load, call.keys, call.args)
            pipe.hmget(keys.queue_control(queue), PAUSED, DRAINING)
            # Loaded: no longer a step waiting on the broker (see keys.fair_sent).
            pipe.zrem(keys.fair_sent(queue), sent_member(tenant, run_id, version))

        reply, flags, _ = self._pipeline(build)
        return loaded_from(reply, version, flags)

    def renew(self, *, tenant: str, run_id: str, queue: str, lease_ms: int) -> bool:
        """Extend a running turn's in-flight lease; False once it is not in flight here."""
        return self.renew_all([InFlight(tenant, run_id, queue, lease_ms)])[0]

    @reached()
    def renew_all(self, turns: Sequence[InFlight]) -> list[bool]:
        """Extend the in-flight leases of `turns` in one round trip (a worker's heartbeat over
        the hundreds of turns a green worker runs); for each, False once it is not in flight
        where it says. A call that failed on the server raises, after the others ran."""
        calls = [
            renew_call(
                tenant=t.tenant, run_id=t.run_id, where=inflight_tag(t.queue), lease_ms=t.lease_ms
            )
            for t in turns
        ]
        if not calls:
            return []

        def build(pipe: Any) -> None:
            for call in calls:
                evalsha(pipe, self._renew, call.keys, call.args)

        return [bool(r) for r in with_scripts(self.client, (self._renew,), build)]

    def hold(self, tenant: str, run_id: str, version: int, argv: list[str]) -> ReserveResult | None:
        """Take a ledger hold for the turn of `version` and record it on the run (see
        run_hold.lua); None when the run moved on, so no hold was taken."""
        call = hold_call(tenant, run_id, version, argv)
        try:
            reply = call_script(self.client, self._hold, call.keys, call.args)
        except UNAVAILABLE as exc:
            return ReserveResult(status="unavailable", admitted=False, detail=str(exc))
        if text(reply[0]) == "stale":
            return None
        if ledger_replies.needs_index(reply):
            self.ledger.index_tenant(tenant)
        return ledger_replies.reserve(reply)

    @reached()
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
        call = mark_call(tenant, run_id, version=version, status=status, fields=fields,
                         event=event)  # fmt: skip
        return marked_from(call_script(self.client, self._mark, call.keys, call.args))

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

    @reached()
    def _first_waiting(self, tenant: str, conversation: str) -> str:
        first = self.client.lindex(keys.conversation_waiting(tenant, conversation), 0)
        return text(first) if first is not None else ""

    def _commit_once(self, change: Change, head: str) -> Committed:
        # Checks the run id as a reservation id, and gives the journal's length for the
        # releases of the run's other holds.
        _, release = self.ledger.settle_script_args(change.tenant, change.run_id, {})
        claim = self._claim_asked(change.claim) if change.next_step is not None else None
        call = packed(commit_call(
            change, head=head, journal_maxlen=release[1], pickup_lease_ms=self.pickup_lease_ms,
            at=now_iso(), claim=claim,
        ))  # fmt: skip
        # A commit that gives the step's slot back wakes the dispatcher in its round trip.
        then = pending.nudge if change.slot else None
        announce_after = False  # on a cluster, a claim that queued after all is announced here
        if change.next_step is not None:
            then = change.next_step.announce
            if claim is not None:  # the script announces a step it queues after all
                then = None
                announce_after = claim.queue_allows is not None
            if then is not None and self.cluster:
                # The entry, then its announcement, in that order (see pending.Pending.announce):
                # a cluster's pipeline sends the two to their nodes in no set order.
                then, announce_after = None, True
        with reached():
            reply = self._durable_call(
                self._commit, call, f"the change to run {change.run_id} was written but",
                then=then,
            )  # fmt: skip
        if announce_after and text(reply[0]) == "ok" and len(reply) == 3:
            self._announce(change.next_step)
        return committed_from(reply, change)

    def _claim_asked(self, claim: Claim | None) -> Claim | None:
        """The claim to ask the commit for: on a cluster, only if the queue's part of the
        check, read first, allows it (see run_commit.lua, "Cluster")."""
        if claim is None or claim.queue_allows is None:
            return claim
        try:
            sent_top = claim.queue_allows(self.client)
        except UNAVAILABLE:
            return None  # the commit itself says whether the store is there
        if sent_top is None:
            return None
        return replace(claim, args=[*claim.args, str(sent_top)])

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
        slot: str = "",
    ) -> Committed:
        """The one way out of a run: every path that ends, parks or cancels a run commits here.

        `state` is the run as it leaves: stopped with its outcome, or parked (`reason` says
        why); None for a state that does not parse, which ends the run `error` with `reason`
        and keeps the stored state as it is. The commit settles `settlements` and releases
        every other hold the run still has open; a run that stops gets its one `finished`
        event, with the closing message built from the state and from what the job's systems
        of record say was done. `slot`, the step's fair-share slot, is given back by the same
        commit, and the dispatcher nudged in the same round trip, when given."""
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
                                                                           fields.CONVERSATION)
        )  # fmt: skip
        return self.commit(
            Change(
                tenant=tenant, run_id=run_id, version=version, old_status=old_status,
                status=status, state_json=state.to_json().decode() if state is not None else "",
                outcome=outcome, detail=detail, reason=reason, lease_ms=None, events=out,
                settlements=list(settlements), clear=list(clear), hold="-", if_idle=if_idle,
                followups_seen=followups_seen, conversation=conversation, slot=slot,
            )
        )  # fmt: skip

    @reached()
    def _field(self, tenant: str, run_id: str, name: str) -> str:
        value = self.client.hget(keys.run(tenant, run_id), name)
        return text(value) if value is not None else ""

    def _finished(self, state: RunState | None, reason: str, at: str) -> dict[str, Any]:
        """A stopped run's one `finished` event (jobs/closing.py), with what the job's systems
        of record say was done; a job this process does not know gets the outcome's opening."""
        if state is None:
            return finished_event(None, None, reason=reason, at=at)
        try:
            job = self.jobs.get(state.job)
        except UnknownJobError:
            return finished_event(state, None, reason=reason, at=at)
        return finished_event(state, job, reason=reason, at=at,
                              recorded=recorded_steps(state, job))  # fmt: skip

    def fail_run(self, tenant: str, run_id: str, reason: str, *, at: str = "") -> Committed:
        """End a live run `error` with the reason, from whatever its hash holds: the state is
        updated when it parses and kept as it is when it does not. Its open holds are
        released, as on every way out."""
        stored = self.hash(tenant, run_id)
        if not stored:
            return Committed("missing")
        if stored.get(fields.STATUS) == Status.STOPPED.value:
            return Committed("stale", version=int(stored[fields.VERSION]))
        state: RunState | None = None
        try:
            state = RunState.from_json(stored.get(fields.STATE, ""))
            finish(state, Outcome.ERROR, excerpt(reason))
        except StateFormatError:
            state = None
        return self.leave(
            tenant=tenant, run_id=run_id, version=int(stored[fields.VERSION]),
            old_status=stored.get(fields.STATUS, Status.RUNNING.value), state=state,
            reason=reason, at=at,
        )  # fmt: skip

    # -- durability: a wrapper around the writing script calls ------------------------------

    def _durable_call(
        self,
        script: Any,
        call: ScriptCall,
        what: str,
        *,
        then: Callable[[Any], None] | None = None,
    ) -> Any:
        """Call a writing script, and `then` add its commands to the same round trip; unless
        durability is `none`, wait for the write to reach the disk or the replicas first (see
        worker/store/durability.py). Returns the script's reply."""
        if not self.wait_for.waits and then is None:
            return call_script(self.client, script, call.keys, call.args)

        def build(pipe: Any) -> None:
            evalsha(pipe, script, call.keys, call.args)
            if then is not None:
                then(pipe)

        return self._durable(build, what, script)[0]

    def fence(self, what: str = "what was read is") -> None:
        """Wait until everything this client has read is where TURNSTILE_DURABILITY wants a
        write (a no-op for `none`), so an observer is never shown what a crash could take back.
        The reader makes a write of its own (a counter) and has it confirmed as any write is:
        it comes after every write it read, and the disk and the replicas take writes in
        order."""
        if self.wait_for.waits:
            self._durable(lambda pipe: pipe.incr(keys.FENCE), what, None)

    def _durable(self, build: Callable[[Any], None], what: str, script: Any) -> list[Any]:
        """The pipeline `build` makes, then, unless durability is `none`, the wait in the same
        round trip (durability.py `written`: NotDurableError when it falls short)."""
        if not self.wait_for.waits:
            return self._pipeline(build)
        return written(self.client, self.wait_for, build, what, (script,) if script else ())

    # -- reading ---------------------------------------------------------------------------

    @reached()
    def hash(self, tenant: str, run_id: str) -> dict[str, str]:
        raw = self.client.hgetall(keys.run(tenant, run_id))
        return {text(k): text(v) for k, v in raw.items()}

    def events(
        self, tenant: str, run_id: str, *, after: str = "-", count: int | None = None
    ) -> list[tuple[str, dict[str, Any]]]:
        start = after if after == "-" else f"({after}"
        entries: list[Any] = self.client.xrange(  # type: ignore[assignment]
            keys.events(tenant, run_id), min=start, count=count
        )
        return [(text(eid), msgspec.json.decode(text(entry["event"]))) for eid, entry in entries]
