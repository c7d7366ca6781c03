"""How a step writes its run: every commit and way out of a turn (`Writer`), and what follows
a commit (the next step sent, a cancel honoured at the boundary, the step's result). Every way
out goes through the store's `leave`; every other change through its `commit`
(run_commit.lua), which also queues the run's next step or claims it (worker/runtime/eager.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import msgspec
import structlog

from turnstile.jobs.conversations import receive, supersede
from turnstile.jobs.decisions import cancel
from turnstile.jobs.errors import StateFormatError
from turnstile.jobs.job import Job
from turnstile.jobs.moves import Continue, Finished, Move, Suspended, finish
from turnstile.jobs.outcomes import Outcome, Status
from turnstile.jobs.state import FollowUp, HeldBudget, RunState
from turnstile.worker.broker.message import StepMessage
from turnstile.worker.observability import metrics, tracing
from turnstile.worker.runtime.eager import Chain
from turnstile.worker.runtime.results import StepResult
from turnstile.worker.runtime.services import Services
from turnstile.worker.scheduling.limits import next_hold, time_limits
from turnstile.worker.settings import Settings
from turnstile.worker.store.run_reads import cancel_marks
from turnstile.worker.store.runs import Change, Committed, Loaded, excerpt, now_iso

log = structlog.get_logger("turnstile.step")


@dataclass(frozen=True)
class Took:
    """The run's next turn, claimed by this turn's commit: its message, the claimed delivery's
    token, and its load (done by the commit's script)."""

    msg: StepMessage
    token: str
    loaded: Loaded


def summary(state: RunState) -> dict[str, Any]:
    """The run hash's summary fields of a state, as a commit writes them."""
    return {
        "status": state.status.value,
        "outcome": state.outcome.value if state.outcome else "",
        "detail": state.detail or "",
        "reason": state.reason or "",
    }


def superseded(state: RunState, by_run: str) -> dict[str, Any]:
    """End the run `superseded` (a newer run of its conversation interrupted it); its event."""
    at = now_iso()
    supersede(state, by_run=by_run, at=at)
    log.info("run_superseded", by_run=by_run)
    return {"type": "superseded", "by_run": by_run, "at": at}


def parse(loaded: Loaded) -> RunState | None:
    """The loaded state, or None when it does not parse."""
    try:
        return RunState.from_json(loaded.state)
    except StateFormatError:
        return None


def _suspended_event(state: RunState) -> dict[str, Any] | None:
    """A suspension's event: the budget hold's fields as stored (kind "budget"), or the held
    call's."""
    if state.status is not Status.SUSPENDED:
        return None
    if state.held_budget is not None:
        return {"type": "suspended", **msgspec.to_builtins(state.held_budget), "at": now_iso()}
    if state.pending is not None:
        held = state.pending
        return {"type": "suspended", "kind": "call", "tool": held.call.name,
                "args": held.call.args, "digest": held.digest, "reason": held.reason,
                "at": now_iso()}  # fmt: skip
    return None


@dataclass
class Writer:
    """One turn's writes to its run, at the version its step message names."""

    services: Services
    msg: StepMessage
    loaded: Loaded
    chain: Chain
    followups_seen: int = 0  # merged messages the load found and this turn's state took in
    next_limits: tuple[float, float] | None = None  # the next step's (soft, hard), once known
    took: Took | None = None  # the run's next turn, once a commit claimed it
    released: bool = False  # a commit gave the step's fair-share slot back (see `slot`)
    # Events a gate recorded for the turn's first write (a migration): see `_with_prelude`.
    prelude: list[dict[str, Any]] = field(default_factory=list)

    @property
    def settings(self) -> Settings:
        return self.services.settings

    @cached_property
    def traceparent(self) -> str:
        return self.msg.traceparent or tracing.run_traceparent(self.msg.run_id)

    @cached_property
    def following(self) -> StepMessage:
        """The message of the run's next step, once this one commits."""
        msg = self.msg
        return StepMessage(msg.tenant, msg.run_id, msg.version + 1, msg.queue, self.traceparent)

    def take_followups(self, state: RunState) -> None:
        """The messages merged into the run since its last turn, into its state: this turn's
        view shows them, and its commit consumes exactly these (see run_commit.lua)."""
        if not self.loaded.followups:
            return
        try:
            taken = msgspec.json.decode(self.loaded.followups, type=list[FollowUp])
        except msgspec.DecodeError as exc:  # never written so: say so, and leave them be
            log.error("followups_unreadable", error=str(exc))
            return
        receive(state, taken)
        self.followups_seen = len(taken)

    # -- ways out ---------------------------------------------------------------------------

    def leave(
        self,
        state: RunState | None,
        *,
        reason: str = "",
        events: list[dict[str, Any]] | None = None,
        settlements: list[list[str]] | None = None,
        clear: list[str] | None = None,
    ) -> Committed:
        """The run ends or parks here: through the store's one way out, which also gives the
        step's slot back (`slot`)."""
        committed = self.services.store.leave(
            tenant=self.msg.tenant, run_id=self.msg.run_id, version=self.msg.version,
            old_status=self.loaded.status or "running", state=state, reason=reason,
            events=self._with_prelude(events or []), settlements=settlements or [],
            clear=clear or [], followups_seen=self.followups_seen, slot=self.slot,
        )  # fmt: skip
        self.released = self.released or committed.released
        return committed

    @property
    def slot(self) -> str:
        """The step's fair-share slot, for a commit that queues no next step (a run that
        stops, parks or suspends) to give back in its own script: with fair share on a single
        server; else "" and the task gives it back, in a round trip of its own (see
        runtime/task.py)."""
        if not self.settings.fair_share or self.services.store.cluster:
            return ""
        return f"{self.msg.run_id}:{self.msg.version}"

    def fail(self, reason: str, state: RunState | None = None) -> Committed:
        """End the run `error` with the reason; the state is kept as it was if it is broken."""
        log.error("run_failed", reason=excerpt(reason))
        if state is not None:
            finish(state, Outcome.ERROR, reason)
        return self.leave(state, reason=reason)

    def park(self, state: RunState, why: str = "") -> Committed:
        """Park the run (status parked, its hold given back): for a flag of its tenant's or its
        queue's, or for `why` (a run waiting for a worker of its job's version)."""
        loaded = self.loaded
        why = why or (
            "tenant paused"
            if loaded.tenant_paused
            else "queue paused"
            if loaded.queue_paused
            else "queue draining"
        )
        state.status = Status.PARKED
        log.info("run_parked", why=why)
        event = {"type": "parked", "why": why, "step": state.usage.steps, "at": now_iso()}
        return self.leave(state, reason=why, events=[event])

    # -- commits ----------------------------------------------------------------------------

    def commit(
        self,
        state: RunState,
        job: Job,
        events: list[dict[str, Any]],
        *,
        settlements: list[list[str]] | None = None,
        clear: list[str] | None = None,
    ) -> Committed:
        """Commit a state the step changed, with its events, and what follows from it: a live
        run's next step queued (or claimed for this worker) and its ledger hold, computed for
        the next step's time limits."""
        if state.status is Status.STOPPED:
            return self.leave(state, events=events, settlements=settlements, clear=clear)
        held = _suspended_event(state)
        if held is not None:
            events.append(held)
        if state.status is not Status.RUNNING:  # suspended: no next step, the slot goes back
            return self._write(
                state, events, settlements, clear, lease_ms=None, hold="-", slot=self.slot
            )
        self.next_limits = limits = time_limits(state, self.settings)
        hold = next_hold(
            self.services.ledger, self.settings, state, job, version=self.msg.version + 1,
            hard_s=limits[1],
        )  # fmt: skip
        return self._write(
            state, events, settlements, clear, hold=hold,
            lease_ms=int(self.settings.pickup_lease_s * 1000),
            next_step=self.services.next_step(self.following, *limits),
        )  # fmt: skip

    def commit_wait(
        self, state: RunState, job: Job, event: dict[str, Any], *, wait_ms: int, reason: str
    ) -> Committed:
        """Commit a turn that waits `wait_ms` for its model endpoint's rate limit: its ledger
        hold released, its next step's hold set, its lease the wait (plus the pickup lease
        with fair share, whose dispatcher queues the step when the wait is over)."""
        self.next_limits = limits = time_limits(state, self.settings)
        hold = next_hold(
            self.services.ledger, self.settings, state, job, version=self.msg.version + 1,
            hard_s=limits[1],
        )  # fmt: skip
        pickup_ms = int(self.settings.pickup_lease_s * 1000) if self.settings.fair_share else 0
        return self.services.store.commit(
            self._change(
                state, lease_ms=wait_ms + pickup_ms, events=[event], hold=hold,
                **{**summary(state), "reason": reason},
            )
        )  # fmt: skip

    def _write(
        self,
        state: RunState,
        events: list[dict[str, Any]],
        settlements: list[list[str]] | None,
        clear: list[str] | None,
        **change: Any,
    ) -> Committed:
        token = ""
        if change.get("next_step") is not None and self.next_limits is not None:
            change["claim"], token = self.chain.claim(
                self.services, self.following, self.next_limits[1]
            )
        committed = self.services.store.commit(
            self._change(
                state, events=events, settlements=settlements or [], clear=clear or [],
                **change, **summary(state),
            )
        )  # fmt: skip
        if committed.claimed is not None:
            self.took = Took(self.following, token, committed.claimed)
        self.released = self.released or committed.released
        return committed

    def _with_prelude(self, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The events a gate recorded ahead of this write (a migration's), then the write's:
        the first write of the turn carries them, whichever it is."""
        prelude, self.prelude = self.prelude, []
        return [*prelude, *events]

    def _change(self, state: RunState, **kw: Any) -> Change:
        kw["events"] = self._with_prelude(list(kw.get("events") or []))
        return Change(
            tenant=self.msg.tenant,
            run_id=self.msg.run_id,
            version=self.msg.version,
            old_status=self.loaded.status or "running",
            state_json=state.to_json().decode(),
            followups_seen=self.followups_seen,
            conversation=state.conversation or "",
            **kw,
        )

    # -- what follows -----------------------------------------------------------------------

    def next(self, committed: Committed, state: RunState, move: Move) -> StepResult:
        """What follows a turn's commit: the next step sent (where the commit did not queue
        or claim it), a cancel asked for while the turn ran honoured, the step's result."""
        refused = self.refused(committed)
        if refused is not None:
            return refused
        if isinstance(move, Continue):
            if not committed.queued and committed.claimed is None:
                assert self.next_limits is not None  # set by the commit of a running state
                self.services.send(self.following, *self.next_limits)
            return StepResult.CONTINUED
        if isinstance(move, Suspended):
            if isinstance(move.held, HeldBudget):
                log.info("run_suspended", needs_budget=move.held.dimensions)
            else:
                log.info("run_suspended", tool=move.held.call.name)
            return self._cancel_if_requested(committed.version, state) or StepResult.SUSPENDED
        assert isinstance(move, Finished)
        log.info("run_finished", outcome=move.outcome.value, detail=move.detail)
        metrics.run_finished(move.outcome.value, move.detail)
        return StepResult.FINISHED

    @staticmethod
    def refused(committed: Committed) -> StepResult | None:
        """The step's result for a commit that did not take; None for one that did."""
        if committed.kind == "stale":
            log.info("turn_discarded", why="another delivery committed this version first")
            return StepResult.STALE
        if committed.kind != "ok":
            log.error("commit_failed", kind=committed.kind, detail=committed.detail)
            return StepResult(f"commit_{committed.kind}")
        return None

    def _cancel_if_requested(self, version: int, state: RunState) -> StepResult | None:
        """A cancel requested while the turn ran (or an interrupt by a newer run of the run's
        conversation) finds the run suspended, where no step will come to see it: honour it
        now, through the same compare-and-set (an operator's decision that got there first
        wins)."""
        marks = cancel_marks(self.services.store.client, self.msg.tenant, self.msg.run_id)
        if not (marks.by or marks.by_run) or marks.version != str(version):
            return None
        if marks.by:
            at, why = now_iso(), marks.reason or "cancelled"
            cancel(state, by=marks.by, at=at, reason=why)
            event = {"type": "decision", "kind": "cancelled", "by": marks.by, "at": at,
                     "reason": why}  # fmt: skip
        else:
            event = superseded(state, marks.by_run)
        left = self.services.store.leave(
            tenant=self.msg.tenant, run_id=self.msg.run_id, version=version,
            old_status=Status.SUSPENDED.value, state=state, events=[event],
            clear=["cancel_by", "cancel_reason"],
        )  # fmt: skip
        if left.kind != "ok":
            return None
        return StepResult.CANCELLED if marks.by else StepResult.SUPERSEDED
