"""The KEYS and ARGV of each of the run store's scripts, built from plain values: pure, so a
call's keys and arguments can be checked without a server (tests/unit/test_run_calls.py, and
tests/unit/test_cluster_slots.py for their slots). Each builder follows the header of its
script in worker/store/lua/, in its order; the store (runs.py) sends what they build.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from typing import Any

import msgspec

from turnstile.jobs.outcomes import Status
from turnstile.worker.store import keys
from turnstile.worker.store.records import Change, Claim, Joining
from turnstile.worker.store.scripts import ScriptCall

HOST = socket.gethostname()
EVENTS_MAXLEN = 10_000  # per run; a run of this many events has long hit its step limit


def inflight_tag(queue: str) -> str:
    """Where a turn runs, as its in-flight entry says: "<queue>|<pid>|<host>"."""
    return f"{queue}|{os.getpid()}|{HOST}"


def encode_event(event: dict[str, Any]) -> str:
    return msgspec.json.encode(event, order="sorted").decode()


def _create_keys(tenant: str, run_id: str) -> list[str]:
    """run_create.lua's KEYS 1-5, every run's (a run of a conversation adds KEYS 6-11)."""
    return [
        keys.run(tenant, run_id),
        keys.events(tenant, run_id),
        keys.runs(tenant),
        keys.by_status(tenant, Status.RUNNING.value),
        keys.leases(tenant),
    ]


def create_call(
    *, tenant: str, run_id: str, state_json: str, fingerprint: str, queue: str, job: str,
    user_id: str, pickup_lease_ms: int, event: dict[str, Any], hold: str, priority: int,
) -> ScriptCall:  # fmt: skip
    """run_create.lua for a run of no conversation."""
    return ScriptCall(
        _create_keys(tenant, run_id),
        [run_id, state_json, fingerprint, queue, job, user_id, pickup_lease_ms,
         encode_event(event), EVENTS_MAXLEN, hold, priority],
    )  # fmt: skip


def join_call(
    *, tenant: str, run_id: str, state_json: str, fingerprint: str, queue: str, job: str,
    user_id: str, pickup_lease_ms: int, event: dict[str, Any], hold: str, priority: int,
    joining: Joining,
) -> ScriptCall:  # fmt: skip
    """run_create.lua for a run of a conversation: KEYS 6-11 and ARGV 12-20 added, the
    active and target runs' keys named as the caller read them (its own when it read none)."""
    base = create_call(
        tenant=tenant, run_id=run_id, state_json=state_json, fingerprint=fingerprint,
        queue=queue, job=job, user_id=user_id, pickup_lease_ms=pickup_lease_ms, event=event,
        hold=hold, priority=priority,
    )  # fmt: skip
    active = joining.active or run_id
    target = joining.target or active
    return ScriptCall(
        [*base.keys, keys.conversation(tenant, joining.key),
         keys.conversation_waiting(tenant, joining.key), keys.run(tenant, active),
         keys.run(tenant, target), keys.events(tenant, target),
         keys.by_status(tenant, Status.WAITING.value)],
        [*base.args, joining.key, joining.policy, joining.active, joining.target,
         joining.waiting_state, joining.followup,
         encode_event(joining.event) if joining.event else "",
         "1" if joining.idempotent else "", joining.max_followups],
    )  # fmt: skip


def load_call(
    *, tenant: str, run_id: str, version: int, inflight_lease_ms: int, where: str,
    delivery: str, after: str = "",
) -> ScriptCall:  # fmt: skip
    """run_load.lua: the run's gate, state and next hold; `where` is `inflight_tag(queue)`."""
    return ScriptCall(
        [keys.run(tenant, run_id), keys.leases(tenant), keys.control(tenant),
         keys.inflight(tenant), *keys.ledger(tenant), keys.live_readers(tenant, run_id)],
        [run_id, version, inflight_lease_ms, where, delivery, after],
    )  # fmt: skip


def sent_member(tenant: str, run_id: str, version: int) -> str:
    """A step's member of its queue's `keys.fair_sent`, which its load removes."""
    return f"{tenant}|{run_id}:{version}"


def renew_call(*, tenant: str, run_id: str, where: str, lease_ms: int) -> ScriptCall:
    """run_renew.lua: a turn's in-flight lease, extended while it runs where it says."""
    return ScriptCall([keys.leases(tenant), keys.inflight(tenant)], [run_id, where, lease_ms])


def hold_call(tenant: str, run_id: str, version: int, argv: Sequence[str]) -> ScriptCall:
    """run_hold.lua: a ledger hold for the turn of `version`, `argv` as
    `Ledger.reserve_script_args` gives it."""
    return ScriptCall([keys.run(tenant, run_id), *keys.ledger(tenant)], [version, *argv])


def mark_call(
    tenant: str, run_id: str, *, version: int, status: str, fields: dict[str, str],
    event: dict[str, Any],
) -> ScriptCall:  # fmt: skip
    """run_mark.lua: `fields` set on the run, compare-and-set on its version and status."""
    args: list[Any] = [version, status, EVENTS_MAXLEN, encode_event(event)]
    for name, value in fields.items():
        args += [name, value]
    return ScriptCall([keys.run(tenant, run_id), keys.events(tenant, run_id)], args)


def commit_call(
    change: Change, *, head: str, journal_maxlen: str, pickup_lease_ms: int, at: str,
    claim: Claim | None = None,
) -> ScriptCall:  # fmt: skip
    """run_commit.lua for `change`: `head` is the conversation's first waiting run as the
    caller read it (a stopping run of a conversation releases it to that run, started at
    `at` with a lease of `pickup_lease_ms`); `journal_maxlen` the ledger journal's length, for
    the releases of the run's other holds; `claim` the eager claim to ask for (fair share
    allowing), with a next step only."""
    tenant = change.tenant
    script_keys = [
        keys.run(tenant, change.run_id),
        keys.events(tenant, change.run_id),
        keys.leases(tenant),
        keys.by_status(tenant, change.old_status),
        keys.by_status(tenant, change.status),
        keys.by_outcome(tenant, change.outcome or "none"),
        keys.inflight(tenant),
        *keys.ledger(tenant),  # every commit closes the run's open holds
    ]
    args: list[Any] = [
        change.run_id, change.version, change.state_json, change.status, change.outcome,
        change.detail, change.reason, "" if change.lease_ms is None else change.lease_ms,
        EVENTS_MAXLEN, len(change.events), *(encode_event(e) for e in change.events),
        len(change.settlements),
    ]  # fmt: skip
    for settlement in change.settlements:
        args += [len(settlement), *settlement]
    args += [len(change.clear), *change.clear, change.hold, "1" if change.if_idle else ""]
    args += [journal_maxlen, change.slot]
    _conversation(change, head=head, pickup_lease_ms=pickup_lease_ms, at=at,
                  script_keys=script_keys, args=args)  # fmt: skip
    if change.slot:  # a run that stops, parks or suspends: no next step, the slot's keys come last
        if change.next_step is not None:
            raise ValueError("a commit that queues the next step keeps its slot")
        script_keys += [keys.slots(tenant), keys.active(tenant)]
    elif change.next_step is not None:
        script_keys += change.next_step.keys
        args += [change.next_step.entry, change.next_step.before]
        if claim is not None:
            script_keys += [*claim.keys, keys.live_readers(tenant, change.run_id)]
            args += claim.args
    return ScriptCall(script_keys, args)


def _conversation(
    change: Change, *, head: str, pickup_lease_ms: int, at: str, script_keys: list[str],
    args: list[Any],
) -> None:  # fmt: skip
    """The commit's follow-ups and, for a stopping run of a conversation, its release's
    keys (at the end of KEYS: a stopping commit queues no next step) and arguments."""
    tenant = change.tenant
    releases = bool(change.conversation) and change.status == Status.STOPPED.value
    args += [change.followups_seen, len(script_keys) + 1 if releases else "", head,
             pickup_lease_ms]  # fmt: skip
    args.append(
        encode_event({"type": "started", "after": change.run_id,
                      "conversation": change.conversation, "at": at})
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


def packed(call: ScriptCall) -> ScriptCall:
    """`call` with its arguments sent as one MessagePack array of strings, which the script
    unpacks (run_commit.lua): packing one value costs the client a fraction of packing a
    hundred. Each argument is the text the client would have sent for it on its own."""
    args = [a if a.__class__ is str or a.__class__ is bytes else str(a) for a in call.args]
    return ScriptCall(call.keys, [msgspec.msgpack.encode(args)])


def expire_call(tenant: str, run_id: str, *, outcome: str, cutoff_ms: int) -> ScriptCall:
    """run_expire.lua: a stopped run removed with everything that names it (retention)."""
    return ScriptCall(
        [keys.run(tenant, run_id), keys.events(tenant, run_id), keys.runs(tenant),
         keys.by_status(tenant, Status.STOPPED.value), keys.by_outcome(tenant, outcome or "none"),
         keys.leases(tenant), keys.inflight(tenant), keys.live(tenant, run_id)],
        [run_id, cutoff_ms, outcome],
    )  # fmt: skip
