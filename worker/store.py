"""The run store: each run's state and version in Redis, its indexes and its event stream.

Three scripts do all the writing: create (once per run), load (once per step: the state, the
attempt count, the lease and the gate flags in one round trip) and commit (every change a run
goes through, compare-and-set on the version, settling the ledger in the same script).
"""

from __future__ import annotations

import hashlib
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import msgspec
import redis

from jobs.errors import StateFormatError
from jobs.kernel import finish
from jobs.outcomes import Outcome, Status
from jobs.state import RunState
from ledger.client import Ledger
from ledger.scripts import library_source
from worker import keys
from worker.durability import WaitFor
from worker.errors import TurnstileError

LUA = Path(__file__).parent / "lua"
HOST = socket.gethostname()
EVENTS_MAXLEN = 10_000  # per run; a run of this many events has long hit its step limit


class StoreUnavailable(TurnstileError):  # noqa: N818 - the store is down, said plainly
    """The store could not be reached; the caller retries later. Nothing was half-written."""


class NotDurableError(StoreUnavailable):
    """A write made but not confirmed where TURNSTILE_DURABILITY wants it (the disk, the
    replicas) in time: a crash of the server now may lose it. A step retries as if the store
    were down (its commit, if it survives, makes the retry a no-op); a caller is told."""


class SubmissionConflictError(TurnstileError):
    """A run id that exists already, submitted with different contents."""


def inflight_tag(queue: str) -> str:
    """Where a turn runs, as its in-flight entry says: "<queue>|<pid>|<host>"."""
    return f"{queue}|{os.getpid()}|{HOST}"


def _script(name: str) -> str:
    return (LUA / f"{name}.lua").read_text()


def fingerprint(payload: Any) -> str:
    return hashlib.sha256(msgspec.json.encode(payload, order="sorted")).hexdigest()[:24]


def encode_event(event: dict[str, Any]) -> str:
    return msgspec.json.encode(event, order="sorted").decode()


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


@dataclass(frozen=True)
class Committed:
    kind: Literal["ok", "stale", "missing", "ledger"]
    version: int = 0
    detail: str = ""


def _s(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode()
    return "" if value is None else str(value)


class RunStore:
    def __init__(
        self, client: redis.Redis, ledger: Ledger, *, wait_for: WaitFor | None = None
    ) -> None:
        self.client = client
        self.ledger = ledger
        self.wait_for = wait_for or WaitFor()  # what a create or a commit reaches first
        self._create = client.register_script(_script("run_create"))
        self._load = client.register_script(library_source() + "\n" + _script("run_load"))
        self._renew = client.register_script(_script("run_renew"))
        self._commit = client.register_script(library_source() + "\n" + _script("run_commit"))

    # -- writing ---------------------------------------------------------------------------

    def _pipeline(self, build: Callable[[Any], None]) -> list[Any]:
        """Run a pipeline that calls scripts by their sha. redis-py's own script support in
        pipelines asks SCRIPT EXISTS first, every time: an extra round trip per step. Here a
        script the server lost (a restart, a failover) is loaded once and the pipeline run
        again; its other commands are reads and idempotent adds."""
        for attempt in range(2):
            pipe = self.client.pipeline(transaction=False)
            build(pipe)
            try:
                return self._execute(pipe)
            except redis.exceptions.NoScriptError:
                if attempt:
                    raise
                for script in (self._create, self._load):
                    script.sha = str(self.client.script_load(script.script))
        raise AssertionError("unreachable")  # pragma: no cover

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
    ) -> tuple[bool, str]:
        """Create the run once. Returns (created, stored fingerprint)."""
        run_keys = [
            keys.run(tenant, run_id),
            keys.events(tenant, run_id),
            keys.runs(tenant),
            keys.by_status(tenant, "running"),
            keys.leases(tenant),
        ]
        args = [
            run_id, state_json, fingerprint, queue, job, user_id,
            pickup_lease_ms, encode_event(event), EVENTS_MAXLEN, hold,
        ]  # fmt: skip

        def build(pipe: Any) -> None:
            pipe.sadd(keys.TENANTS, tenant)
            pipe.sadd(keys.QUEUES, queue)
            pipe.evalsha(self._create.sha, len(run_keys), *run_keys, *args)

        reply = self._durable(
            build, f"the submission of run {run_id} was written but", self._create
        )[-1]
        created = _s(reply[0]) == "created"
        return created, fingerprint if created else _s(reply[1])

    def load(
        self, *, tenant: str, run_id: str, version: int, queue: str, inflight_lease_ms: int
    ) -> Loaded:
        """The step's one read: gate, state and the next turn's ledger hold, in one script,
        pipelined with the queue's flags."""
        script_keys = [
            keys.run(tenant, run_id),
            keys.leases(tenant),
            keys.control(tenant),
            keys.inflight(tenant),
            *keys.ledger(tenant),
        ]
        args = [run_id, version, inflight_lease_ms, inflight_tag(queue)]

        def build(pipe: Any) -> None:
            pipe.evalsha(self._load.sha, len(script_keys), *script_keys, *args)
            pipe.hmget(keys.queue_control(queue), "paused", "draining")

        reply, flags = self._pipeline(build)
        kind = _s(reply[0])
        if kind == "missing":
            return Loaded("missing")
        if kind in ("stale", "idle", "busy"):
            return Loaded(kind, version=int(reply[1]), status=_s(reply[2]))  # type: ignore[arg-type]
        return Loaded(
            "go",
            version=version,
            status=_s(reply[6]),
            state=_s(reply[1]),
            attempts=int(reply[2]),
            tenant_paused=bool(_s(reply[3])),
            cancel_by=_s(reply[4]),
            cancel_reason=_s(reply[5]),
            queue_paused=bool(_s(flags[0])),
            queue_draining=bool(_s(flags[1])),
            hold=_s(reply[7]),
            hold_reply=reply[8],
            hold_id=_s(reply[9]),
        )

    def renew(self, *, tenant: str, run_id: str, queue: str, lease_ms: int) -> bool:
        """Extend a running turn's in-flight lease; False once it is not in flight here."""
        reply = self._renew(
            keys=[keys.leases(tenant), keys.inflight(tenant)],
            args=[run_id, inflight_tag(queue), lease_ms],
        )
        return bool(reply)

    def commit(self, change: Change) -> Committed:
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
        if change.settlements:
            script_keys += keys.ledger(tenant)
        args += [len(change.clear), *change.clear, change.hold]
        try:
            reply = self._durable_call(
                self._commit,
                script_keys,
                args,
                f"the change to run {change.run_id} was written but",
            )
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise StoreUnavailable(f"store unavailable: {exc}") from exc
        kind = _s(reply[0])
        if kind == "ok":
            return Committed("ok", version=int(reply[1]))
        if kind == "stale":
            return Committed("stale", version=int(reply[1]))
        if kind == "ledger":
            return Committed("ledger", detail=f"{_s(reply[1])} {_s(reply[2])}".strip())
        return Committed("missing")

    def fail_run(self, tenant: str, run_id: str, reason: str, *, at: str = "") -> Committed:
        """End a live run `error` with the reason, from whatever its hash holds: the state is
        updated when it parses and kept as it is when it does not."""
        stored = self.hash(tenant, run_id)
        if not stored:
            return Committed("missing")
        if stored.get("status") == Status.STOPPED.value:
            return Committed("stale", version=int(stored["version"]))
        state_json = ""
        try:
            state = RunState.from_json(stored.get("state", ""))
            finish(state, Outcome.ERROR, reason)
            state_json = state.to_json().decode()
        except StateFormatError:
            pass
        event = {"type": "finished", "outcome": "error", "reason": reason, "at": at}
        return self.commit(
            Change(
                tenant=tenant, run_id=run_id, version=int(stored["version"]),
                old_status=stored.get("status", "running"), status=Status.STOPPED.value,
                state_json=state_json, outcome=Outcome.ERROR.value, reason=reason, events=[event],
            )
        )  # fmt: skip

    # -- durability: a wrapper around the writing script calls ------------------------------

    def _durable_call(self, script: Any, script_keys: list[str], args: list[Any], what: str) -> Any:
        """Call a writing script; unless durability is `none`, wait for the write to reach
        the disk or the replicas first (see worker/durability.py)."""
        if not self.wait_for.waits:
            return script(keys=script_keys, args=args)

        def build(pipe: Any) -> None:
            pipe.evalsha(script.sha, len(script_keys), *script_keys, *args)

        return self._durable(build, what, script)[-1]

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
        writes. Raises NotDurableError when the wait times out or the server cannot wait."""
        if not self.wait_for.waits:
            return self._pipeline(build)
        for attempt in range(2):
            pipe: Any = self.client.pipeline(transaction=False)
            build(pipe)
            pipe.execute_command(*self.wait_for.command())
            try:
                replies = list(pipe.execute(raise_on_error=False))
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                raise StoreUnavailable(f"store unavailable: {exc}") from exc
            *written, waited = replies
            if isinstance(written[-1], redis.exceptions.NoScriptError) and script and not attempt:
                script.sha = str(self.client.script_load(script.script))
                continue
            for reply in written:
                if isinstance(reply, Exception):
                    raise reply
            if isinstance(waited, Exception):
                raise NotDurableError(f"{what} cannot be confirmed: {waited}")
            shortfall = self.wait_for.shortfall(waited, what)
            if shortfall:
                raise NotDurableError(shortfall)
            return written
        raise AssertionError("unreachable")  # pragma: no cover

    def _execute(self, pipe: Any) -> list[Any]:
        try:
            return list(pipe.execute())
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise StoreUnavailable(f"store unavailable: {exc}") from exc

    # -- reading ---------------------------------------------------------------------------

    def hash(self, tenant: str, run_id: str) -> dict[str, str]:
        try:
            raw = self.client.hgetall(keys.run(tenant, run_id))
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise StoreUnavailable(f"store unavailable: {exc}") from exc
        return {_s(k): _s(v) for k, v in raw.items()}

    def events(
        self, tenant: str, run_id: str, *, after: str = "-", count: int | None = None
    ) -> list[tuple[str, dict[str, Any]]]:
        start = after if after == "-" else f"({after}"
        entries: list[Any] = self.client.xrange(  # type: ignore[assignment]
            keys.events(tenant, run_id), min=start, count=count
        )
        return [(_s(eid), msgspec.json.decode(_s(fields["event"]))) for eid, fields in entries]
