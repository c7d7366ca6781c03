"""What the run store's scripts are given and what they answer, as values: a submission to a
conversation (`Joining`), one commit (`Change`, with the next step it queues or claims), and
each script's reply decoded (`Joined`, `Loaded`, `Committed`, `Started`), and a turn in
flight whose lease a heartbeat renews (`InFlight`). Pure: no I/O; the
replies' shapes are the ones the scripts' headers give (worker/store/lua/run_*.lua).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from turnstile.worker.store.values import text


@dataclass(frozen=True)
class InFlight:
    """A turn running on this worker, whose in-flight lease run_renew.lua extends by
    `lease_ms` while it runs from `queue`."""

    tenant: str
    run_id: str
    queue: str
    lease_ms: int


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
    watched: bool = False  # someone reads the run's live output now (worker/store/live.py)


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
    # The step's fair-share slot ("<run id>:<version>") given back by this commit, for a run
    # that stops, parks or suspends (see run_commit.lua), or "": the caller gives it back.
    slot: str = ""
    conversation: str = ""  # the run's conversation: a stopping commit releases it


class NextStep(Protocol):
    """A run's next step as its tenant's pending list takes it (`Pending` in
    worker/store/pending.py)."""

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
    # are in no tenant's slot; `keys` then holds the tenant's two only): None, no claim; else
    # the highest priority of the tenant's continuations sent and not loaded (-1: none).
    queue_allows: Callable[[Any], int | None] | None = None


@dataclass(frozen=True)
class Committed:
    kind: Literal["ok", "stale", "missing", "ledger", "busy", "moved"]
    version: int = 0
    detail: str = ""
    queued: bool = False  # the commit queued the run's next step (`Change.next_step`)
    claimed: Loaded | None = None  # or claimed it, and loaded it for this worker (`claim`)
    started: Started | None = None  # the run of its conversation that this commit started
    released: bool = False  # the commit gave the step's fair-share slot back (`Change.slot`)


@dataclass(frozen=True)
class Started:
    """A waiting run of a conversation that a stopping commit made active: its first step is
    the caller's to send (its lease makes the sweeper send it otherwise)."""

    tenant: str
    run_id: str
    queue: str
    state: str


# -- the scripts' replies -------------------------------------------------------------------


def created_from(reply: Any, fingerprint: str) -> tuple[bool, str]:
    """run_create.lua's reply to a run of no conversation: (created, stored fingerprint)."""
    created = text(reply[0]) == "created"
    return created, fingerprint if created else text(reply[1])


def joined_from(reply: Any) -> Joined:
    """run_create.lua's reply to a run of a conversation (see its Returns)."""
    kind = text(reply[0])
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
        supersede_by=text(reply[11]),
        followups=text(reply[12]),
        watched=bool(text(reply[13])),
    )


def committed_from(reply: Any, change: Change) -> Committed:
    """run_commit.lua's reply as a Committed: "ok" with the new version and what became of the
    next step (queued; claimed, with its load; or, for a stopping run of a conversation, the
    waiting run it started), "stale" or "busy" with the stored version, "ledger" or "moved"
    with what was refused, or "missing"."""
    kind = text(reply[0])
    if kind == "ok":
        if len(reply) == 4:  # claimed: the step's load, as run_load.lua would reply
            claimed = loaded_from(reply[3], int(reply[1]), None)
            return Committed("ok", version=int(reply[1]), claimed=claimed)
        if len(reply) == 6:  # a waiting run of the conversation started
            started = Started(change.tenant, text(reply[3]), text(reply[4]), text(reply[5]))
            return Committed("ok", version=int(reply[1]), started=started)
        return Committed("ok", version=int(reply[1]), queued=change.next_step is not None,
                         released=bool(change.slot))  # fmt: skip
    if kind in ("stale", "busy"):
        return Committed(kind, version=int(reply[1]))  # type: ignore[arg-type]
    if kind in ("ledger", "moved"):  # moved: the first waiting run of the conversation now
        said = " ".join(text(part) for part in reply[1:]).strip()
        return Committed(kind, detail=said)  # type: ignore[arg-type]
    return Committed("missing")


def marked_from(reply: Any) -> Committed:
    """run_mark.lua's reply as a Committed: "ok", "stale" (with the stored status as its
    detail) or "missing"."""
    kind = text(reply[0])
    if kind == "ok":
        return Committed("ok", version=int(reply[1]))
    if kind == "stale":
        return Committed("stale", version=int(reply[1]), detail=text(reply[2]))
    return Committed("missing")
