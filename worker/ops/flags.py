"""Pause, drain and resume, as flags that live in Redis.

The flags are read by every step at its gate, in the same round trip as the run, so they are
honoured at every turn boundary by every worker, running now or started later; a step that
finds its queue or tenant paused (or its queue draining) parks the run and acks. Resuming
clears the flag and re-enqueues each parked run exactly once: the run moves parked -> running
through the store's version compare-and-set, and only the caller whose commit won sends the
step, so two resumes racing each other cannot both send it.

The flags are kept by worker/store/controls.py: `paused` (and, for a queue, `draining`) as
the ISO time the flag was set, with who set it, and who last resumed, when.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from turnstile.jobs.errors import StateFormatError
from turnstile.jobs.outcomes import Status
from turnstile.jobs.state import RunState
from turnstile.worker.broker.message import StepMessage
from turnstile.worker.client._client import Client
from turnstile.worker.ops.subjects import Subject, check_known, live_inflight, parked_runs
from turnstile.worker.scheduling.limits import next_hold, time_limits
from turnstile.worker.scheduling.sweeper import time_limits_default
from turnstile.worker.store import controls, fields
from turnstile.worker.store.records import Change
from turnstile.worker.store.values import now_iso

# A step that read a flag just before it was cleared still parks its run, a few milliseconds
# later; resume looks at the parked set again once such steps are done, waiting at most this.
PARK_SETTLE_S = 2.0


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
    made, at, by = controls.set_flag(c.client, subject.kind, subject.name, flag, by=by,
                                     at=now_iso())  # fmt: skip
    return Flagged(subject.kind, subject.name, flag, by, at, not made)


def pause(c: Client, subject: Subject, *, by: str) -> Flagged:
    """Pause a queue or a tenant: from the next turn boundary on, every step of it parks its
    run instead of reserving anything. Pausing what is paused changes nothing."""
    return _set_flag(c, subject, controls.PAUSED, by)


def drain(c: Client, queue: str, *, by: str) -> Flagged:
    """Drain a queue: new submissions to it are refused, turns in flight finish, and their
    runs park at the next boundary. Draining what is draining changes nothing."""
    return _set_flag(c, Subject(queue=queue), controls.DRAINING, by)


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
    flags = [controls.PAUSED] if subject.queue is None else [controls.PAUSED, controls.DRAINING]
    return controls.clear_flags(c.client, subject.kind, subject.name, flags)


def _gates_clear(c: Client, tenant: str, queue: str, cache: dict[tuple[str, str], bool]) -> bool:
    """Would a step of this tenant on this queue run its turn now? `cache` keeps each gate's
    answer by (kind, name), so no tenant's name can stand for a queue's."""
    if ("tenant", tenant) not in cache:
        cache["tenant", tenant] = not controls.tenant_paused(c.client, tenant)
    if ("queue", queue) not in cache:
        cache["queue", queue] = controls.queue_open(c.client, queue)
    return cache["tenant", tenant] and cache["queue", queue]


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
    if stored.get(fields.STATUS) != Status.PARKED.value:
        return "skipped"
    version = int(stored[fields.VERSION])
    try:
        state: RunState | None = RunState.from_json(stored[fields.STATE])
    except StateFormatError:
        state = None  # the step will end the run `error`, saying why
    if state is not None:
        state.status = Status.RUNNING
    steps = state.usage.steps if state is not None else None
    committed = c.store.commit(
        Change(
            tenant=tenant, run_id=run_id, version=version,
            old_status=Status.PARKED.value, status=Status.RUNNING.value,
            state_json=state.to_json().decode() if state is not None else "",
            lease_ms=int(c.config.pickup_lease_s * 1000),
            events=[{"type": "resumed", "by": by, "at": at, "step": steps}],
            hold=_resumed_hold(c, state, version + 1),
        )
    )  # fmt: skip
    if committed.kind != "ok":
        return "skipped"
    soft_s, hard_s = (
        time_limits(state, c.config) if state is not None else time_limits_default(c.config)
    )
    try:
        msg = StepMessage(tenant, run_id, committed.version, stored[fields.QUEUE])
        c.send(msg, soft_s, hard_s)
    except Exception:  # any failure of the broker client: the sweeper covers it
        return "deferred"
    return "sent"


def _requeue_pass(c: Client, subject: Subject, by: str, at: str, done: Resumed) -> None:
    cache: dict[tuple[str, str], bool] = {}
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
    controls.mark_resumed(c.client, subject.kind, subject.name, by=by, at=at)
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
