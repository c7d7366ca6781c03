"""The Client's reads of a run: its tenant, its stored record and state, waiting for it to
stop or suspend, and following its events as they are committed (`Reading`, which `Client`
is made of)."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import redis

from turnstile.errors import InvalidEventIdError, RunNotFoundError, WaitTimeoutError
from turnstile.jobs.outcomes import Status
from turnstile.jobs.state import RunState
from turnstile.worker.store import live as live_store
from turnstile.worker.store import run_reads
from turnstile.worker.store.live import Cursor
from turnstile.worker.store.runs import RunStore

EVENT_ID = re.compile(r"^[0-9]{1,20}-[0-9]{1,20}$")  # a stream entry id, as `RunEvent.id` gives
FINAL = frozenset({Status.STOPPED.value, Status.SUSPENDED.value})  # what `wait` returns on
FOLLOW_BLOCK_MS = 1000  # one blocking read of the event stream, between looks at the status


@dataclass(frozen=True)
class RunEvent:
    """One stored event of a run, as `Client.events` yields it: its stream `id` (pass it as
    `after` to resume after it), its `type` (`submitted`, `turn`, `suspended`, `decision`,
    `parked`, `resumed`, `cancel_requested`, `finished`, ...) and the whole stored event as
    `data`, the same JSON the HTTP API's event stream carries. Read with `live=True`, also
    the run's live output (`live` is then true: `text`, `tool_started`, `tool_ended`,
    `progress`, `abandoned`, see docs/live.md), and `id` is a cursor over both streams."""

    id: str
    type: str
    data: dict[str, Any]
    live: bool = False


class Reading:
    """Reading a run, for `Client`, over the store client and the run store it holds."""

    client: redis.Redis
    store: RunStore
    block_ms: int  # one blocking read of a run's events, within the store client's timeout

    def tenant_of(self, run_id: str) -> str:
        """The tenant a run belongs to; RunNotFoundError if there is no such run."""
        tenant = run_reads.tenant_of(self.client, run_id)
        if not tenant:
            raise RunNotFoundError(f"no run {run_id!r}")
        return tenant

    def run_hash(self, run_id: str, tenant: str | None = None) -> tuple[str, dict[str, str]]:
        """The run's tenant and its stored record (status, outcome, detail, reason, version,
        the state as JSON, ...); scoped to `tenant` when given."""
        tenant = tenant or self.tenant_of(run_id)
        stored = self.store.hash(tenant, run_id)
        if not stored:
            raise RunNotFoundError(f"no run {run_id!r} for tenant {tenant!r}")
        return tenant, stored

    def state(self, run_id: str, tenant: str | None = None) -> RunState:
        """The run's state as stored now: status, outcome and reason, usage, plan, facts, the
        held call, the answer."""
        _, stored = self.run_hash(run_id, tenant)
        return RunState.from_json(stored["state"])

    def wait(self, run_id: str, timeout_s: float, *, tenant: str | None = None) -> RunState:
        """The run's state once it can go no further by itself, within `timeout_s` seconds:

        - stopped: it has its outcome (`state.outcome`: completed, error, ..., with
          `state.reason`), or
        - suspended: it waits for a person (`state.held`: the held call, `kind` "call", or
          a budget hold, `kind` "budget"; `approve` or `deny` it, then wait again).

        A running run is waited for, and so is a parked one (its tenant or queue is paused or
        draining: `resume` brings it back). Past `timeout_s`, WaitTimeoutError. It blocks on
        the run's event stream, not in a polling loop: it returns as soon as the commit that
        stops or suspends the run is stored."""
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float) or timeout_s < 0:
            raise ValueError(f"timeout_s must be seconds >= 0, got {timeout_s!r}")
        deadline = time.monotonic() + timeout_s
        tenant, _ = self.run_hash(run_id, tenant)
        while True:
            # The newest event id before the status: a commit after this read appends an
            # event past it, so the blocking read below returns at once and nothing is missed.
            last = run_reads.newest_event(self.client, tenant, run_id)
            stored = self.store.hash(tenant, run_id)
            if not stored:
                raise RunNotFoundError(f"no run {run_id!r} for tenant {tenant!r}")
            if stored.get("status") in FINAL:
                return RunState.from_json(stored["state"])
            left_ms = int((deadline - time.monotonic()) * 1000)
            if left_ms <= 0:
                raise WaitTimeoutError(
                    f"run {run_id} is still {stored.get('status')} after {timeout_s:g} s"
                )
            block_ms = min(left_ms, self.block_ms)
            run_reads.read_events(self.client, tenant, run_id, last, count=1, block_ms=block_ms)

    def events(
        self,
        run_id: str,
        after: str | None = None,
        *,
        tenant: str | None = None,
        timeout_s: float | None = None,
        live: bool = False,
    ) -> Iterator[RunEvent]:
        """The run's stored events in stored order, from the first (or the one after `after`,
        a `RunEvent.id`), then the new ones as they are committed, until its `finished` event
        (the iteration ends after it) or `timeout_s` passes. What is yielded was read back
        from the store, so it has been persisted. A suspended or parked run is followed for
        as long as it takes (or `timeout_s`). The run is looked up now: an unknown run raises
        RunNotFoundError here, not at the first event.

        With `live=True`, the run's live output comes between its events as it is written: the
        answer's words as the model writes them (`text`: drop a turn's text on `abandoned`),
        tool calls starting and ending, their progress notes. Its ids resume the same way
        (`after`), in the middle of a turn too; the committed `turn` event is the truth."""
        if live:
            cursor = Cursor.parse(after) if isinstance(after, str) else Cursor()
            if cursor is None:
                raise InvalidEventIdError(
                    f"bad event id {after!r}: a RunEvent.id, such as 1764547200000-0/17645472-3"
                )
            tenant, _ = self.run_hash(run_id, tenant)
            deadline = None if timeout_s is None else time.monotonic() + timeout_s
            return self._follow_live(tenant, run_id, cursor, deadline)
        if after is not None and not (isinstance(after, str) and EVENT_ID.match(after)):
            raise InvalidEventIdError(
                f"bad event id {after!r}: a RunEvent.id, such as 1764547200000-0"
            )
        tenant, _ = self.run_hash(run_id, tenant)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        return self._follow(tenant, run_id, after or run_reads.NO_EVENT, deadline)

    def _follow_live(
        self, tenant: str, run_id: str, cursor: Cursor, deadline: float | None
    ) -> Iterator[RunEvent]:
        stopped = False
        watched_at = 0.0
        while True:
            if time.monotonic() - watched_at >= 1.0:  # a turn that starts now writes its output
                watched_at = time.monotonic()
                live_store.watch(self.client, tenant, run_id)
            block = self._block(stopped, deadline)
            entries = live_store.read(
                self.client, tenant, run_id, cursor, count=200, block_ms=block
            )
            for entry in entries:
                cursor = cursor.past(entry)
                yield RunEvent(str(cursor), entry.type, entry.data, entry.live)
                if entry.type == "finished" and not entry.live:
                    return
            if entries:
                continue
            if stopped or (deadline is not None and time.monotonic() >= deadline):
                return
            stopped = run_reads.status(self.client, tenant, run_id) == Status.STOPPED.value

    def _block(self, stopped: bool, deadline: float | None) -> int | None:
        """How long the next read blocks: not at all once the run is seen stopped (one more
        read gets what its commit wrote), else `block_ms`, cut to what is left before `deadline`."""
        if stopped:
            return None
        if deadline is None:
            return self.block_ms
        return max(1, min(self.block_ms, int((deadline - time.monotonic()) * 1000)))

    def _follow(
        self, tenant: str, run_id: str, last: str, deadline: float | None
    ) -> Iterator[RunEvent]:
        stopped = False
        while True:
            block = self._block(stopped, deadline)
            entries = run_reads.read_events(
                self.client, tenant, run_id, last, count=200, block_ms=block
            )
            for eid, event in entries:
                last = eid
                yield RunEvent(eid, str(event.get("type")), event)
                if event.get("type") == "finished":
                    return
            if entries:
                continue
            if stopped or (deadline is not None and time.monotonic() >= deadline):
                return
            # The commit writes the status and the events in one script: a run seen stopped
            # has its `finished` event in the stream already, so one more read gets it.
            stopped = run_reads.status(self.client, tenant, run_id) == Status.STOPPED.value
