"""One step of a run, in its order: gate, load, admit, turn, commit, next.

The Celery task only parses its message and calls `Step(...).run()`; everything here is plain
Python over the store, the ledger and the kernel, so the order is readable in one place.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import msgspec
import structlog
from celery.exceptions import SoftTimeLimitExceeded

from turnstile.errors import StoreUnavailableError
from turnstile.jobs.budget import Usage
from turnstile.jobs.clock import ActiveClock
from turnstile.jobs.conversations import receive, start, supersede
from turnstile.jobs.decisions import cancel
from turnstile.jobs.errors import StateFormatError, UnknownJobError
from turnstile.jobs.extensions import TENANT, tenant_hold
from turnstile.jobs.job import Job
from turnstile.jobs.kernel import (
    Continue,
    Finished,
    Move,
    Runtime,
    Suspended,
    exposure,
    finish,
    turn,
)
from turnstile.jobs.model import Model
from turnstile.jobs.outcomes import Outcome, Resource, Status
from turnstile.jobs.state import FollowUp, HeldBudget, RunState
from turnstile.jobs.trace import Trace
from turnstile.ledger import replies as ledger_replies
from turnstile.ledger.results import ReserveResult
from turnstile.providers.errors import ProviderConfigError
from turnstile.providers.runs import model_for_run
from turnstile.worker.broker.message import StepMessage
from turnstile.worker.observability import metrics, tracing
from turnstile.worker.runtime import pools
from turnstile.worker.runtime.services import Services
from turnstile.worker.scheduling import ratelimits
from turnstile.worker.scheduling.limits import hold_id, ledger_amounts, next_hold, time_limits
from turnstile.worker.settings import Settings
from turnstile.worker.store import keys
from turnstile.worker.store.runs import (
    Change,
    Committed,
    Loaded,
    RunStore,
    excerpt,
    now_iso,
)

log = structlog.get_logger("turnstile.step")


class LedgerDown(StoreUnavailableError):  # noqa: N818 - the ledger is down, said plainly
    """The ledger did not answer: hard limits fail closed, the step is retried later."""


class LedgerGate:
    """Asks the tenant's ledger for a batch larger than the turn's allowance, before it runs.
    The hold is recorded on the run (the next commit settles or releases it), and taken only
    while the run is still at the version the turn loaded."""

    def __init__(self, store: RunStore, msg: StepMessage, reservation_id: str, timeout_s: float):
        self.store, self.msg, self.reservation_id, self.timeout_s = (
            store,
            msg,
            reservation_id,
            timeout_s,
        )
        self.reserved: Usage | None = None
        self.rejected: str | None = None  # the dimension that refused, for tenant.<dimension>

    def extend(self, extra: Usage) -> bool:
        """Admitted or not. An unreachable ledger is no refusal (the run would end as if its
        tenant were out of budget): the step is retried, as when the load finds it down. A run
        that moved on past the turn's version takes no hold."""
        _, argv = self.store.ledger.reserve_script_args(
            self.msg.tenant, self.reservation_id, ledger_amounts(extra), timeout_s=self.timeout_s
        )
        result = self.store.hold(self.msg.tenant, self.msg.run_id, self.msg.version, argv)
        if result is None:
            return False
        if result.status == "unavailable":
            raise LedgerDown(result.detail)
        if result.admitted:
            self.reserved = extra
        self.rejected = result.first_rejected
        return result.admitted


def split_actual(actual: Usage, holds: list[tuple[str, Usage]]) -> list[tuple[str, Usage]]:
    """Share a turn's actual usage among its holds, each taking up to what it reserved; the
    last takes whatever is left (an overage is booked, and flagged, on it)."""
    left = ledger_amounts(actual)
    out = []
    for index, (reservation_id, held) in enumerate(holds):
        limit = ledger_amounts(held)
        last = index == len(holds) - 1
        share = {d: left[d] if last else min(left[d], limit.get(d, 0)) for d in left}
        left = {d: left[d] - share[d] for d in left}
        out.append((reservation_id, Usage.from_ledger_amounts(share)))
    return out


def answered_by(trace: Trace) -> dict[str, str]:
    """Which model answered the turn (and why a fallback did), for its event, when known."""
    span = next((s for s in trace.spans if s.kind == "model"), None)
    attrs = span.attrs if span is not None else {}
    return {k: str(attrs[k]) for k in ("model", "fallback") if attrs.get(k)}


# A claimed turn's own hard limit may end this much after the delivery's (whose limits Celery
# enforces): the delivery's soft limit then fires at most this much before the turn's would.
EAGER_SLACK_S = 1.0


@dataclass
class Step:
    """One delivery of a step message being handled, or one turn its commit claimed (eager
    continuation: the run's next step, run by the same task at once, see run_commit.lua)."""

    services: Services
    msg: StepMessage
    delivery: str = "-"  # the message: its task id and retry count
    after: str = ""  # the earlier delivery of this step that exited cleanly, if any
    loaded: bool = False  # whether this delivery's load ran (and so counted as an attempt)
    # This delivery, as its load records it: the message, and a nonce, since a message
    # redelivered after a kill is the same message but another delivery.
    token: str = ""
    # Eager continuation: how many more turns of the run this delivery may claim, and when
    # its hard time limit ends (monotonic; None: no limit), which a claimed turn must fit in.
    eager: int = 0
    deadline: float | None = None
    claimed: Loaded | None = None  # this turn's load, done by the commit that claimed it
    chain: int = 0  # its place in its delivery's chain of claimed turns (its token says "+n")
    committed_at: float = 0.0  # when that commit returned (monotonic), for the gap
    following: Step | None = None  # the next turn, once this one's commit claimed it
    drawn: tuple[str, int] | None = None  # the rate-limited endpoint and the tokens drawn
    followups_seen: int = 0  # merged messages the load found and this turn's state took in

    def __post_init__(self) -> None:
        self.token = self.token or f"{self.delivery}.{secrets.token_hex(4)}"

    @property
    def clean_exit(self) -> str:
        """What a retry of this delivery names as `after`: this delivery if its load counted
        it, else whatever this one was given."""
        return self.token if self.loaded else self.after

    @property
    def settings(self) -> Settings:
        return self.services.settings

    # -- commits ---------------------------------------------------------------------------

    def _change(self, state: RunState | None, loaded: Loaded, **kw: Any) -> Change:
        return Change(
            tenant=self.msg.tenant,
            run_id=self.msg.run_id,
            version=self.msg.version,
            old_status=loaded.status or "running",
            state_json=state.to_json().decode() if state is not None else "",
            followups_seen=self.followups_seen,
            conversation=(state.conversation or "") if state is not None else "",
            **kw,
        )

    def _summary(self, state: RunState) -> dict[str, Any]:
        return {
            "status": state.status.value,
            "outcome": state.outcome.value if state.outcome else "",
            "detail": state.detail or "",
            "reason": state.reason or "",
        }

    def _leave(
        self,
        loaded: Loaded,
        state: RunState | None,
        *,
        reason: str = "",
        events: list[dict[str, Any]] | None = None,
        settlements: list[list[str]] | None = None,
        clear: list[str] | None = None,
    ) -> Committed:
        """The run ends or parks here: through the store's one way out."""
        return self.services.store.leave(
            tenant=self.msg.tenant, run_id=self.msg.run_id, version=self.msg.version,
            old_status=loaded.status or "running", state=state, reason=reason,
            events=events or [], settlements=settlements or [], clear=clear or [],
            followups_seen=self.followups_seen,
        )  # fmt: skip

    def fail(self, loaded: Loaded, reason: str, state: RunState | None = None) -> Committed:
        """End the run `error` with the reason; the state is kept as it was if it is broken."""
        log.error("run_failed", reason=excerpt(reason))
        if state is not None:
            finish(state, Outcome.ERROR, reason)
        return self._leave(loaded, state, reason=reason)

    def park(self, loaded: Loaded, state: RunState) -> Committed:
        why = (
            "tenant paused"
            if loaded.tenant_paused
            else "queue paused"
            if loaded.queue_paused
            else "queue draining"
        )
        state.status = Status.PARKED
        log.info("run_parked", why=why)
        event = {"type": "parked", "why": why, "step": state.usage.steps, "at": now_iso()}
        return self._leave(loaded, state, reason=why, events=[event])

    def finish_now(
        self,
        loaded: Loaded,
        state: RunState,
        job: Job,
        events: list[dict[str, Any]],
        *,
        settlements: list[list[str]] | None = None,
        clear: list[str] | None = None,
    ) -> Committed:
        """Commit a state the step changed, with its events, and what follows from it."""
        if state.status is Status.STOPPED:
            return self._leave(loaded, state, events=events, settlements=settlements, clear=clear)
        if state.status is Status.SUSPENDED and state.held_budget is not None:
            # A held decision of its own kind: the hold's fields as stored (kind "budget").
            events.append(
                {"type": "suspended", **msgspec.to_builtins(state.held_budget), "at": now_iso()}
            )
        elif state.status is Status.SUSPENDED and state.pending is not None:
            held = state.pending
            events.append(
                {"type": "suspended", "kind": "call", "tool": held.call.name,
                 "args": held.call.args,
                 "digest": held.digest, "reason": held.reason, "at": now_iso()}
            )  # fmt: skip
        live = state.status is Status.RUNNING
        lease = int(self.settings.pickup_lease_s * 1000) if live else None
        hold = (
            next_hold(self.services.ledger, self.settings, state, job, version=self.msg.version + 1)
            if live
            else "-"
        )
        next_step = self.services.next_step(self._following, state) if live else None
        claim, token = None, f"{self.delivery}+{self.chain + 1}.{secrets.token_hex(4)}"
        if next_step is not None and self.eager > 0:
            _, hard_s = time_limits(state, self.settings)
            fits = self.deadline is None or time.monotonic() + hard_s <= (
                self.deadline + min(EAGER_SLACK_S, self.settings.soft_margin_s / 2)
            )
            claim = self.services.claim(self._following, hard_s, token) if fits else None
        committed = self.services.store.commit(
            self._change(
                state, loaded, lease_ms=lease, events=events, hold=hold,
                settlements=settlements or [], clear=clear or [], next_step=next_step,
                claim=claim, **self._summary(state),
            )
        )  # fmt: skip
        if committed.claimed is not None:
            self.following = Step(
                self.services, self._following, delivery=self.delivery, token=token,
                eager=self.eager - 1, deadline=self.deadline, claimed=committed.claimed,
                chain=self.chain + 1, committed_at=time.monotonic(),
            )  # fmt: skip
        return committed

    @property
    def _following(self) -> StepMessage:
        """The message of the run's next step, once this one commits."""
        return StepMessage(
            self.msg.tenant, self.msg.run_id, self.msg.version + 1, self.msg.queue,
            self._traceparent,
        )  # fmt: skip

    # -- the step --------------------------------------------------------------------------

    def run(self) -> str:
        """Handle the delivery; returns what happened, for the log and the tests."""
        loaded = self.claimed or self.services.store.load(
            tenant=self.msg.tenant, run_id=self.msg.run_id, version=self.msg.version,
            queue=self.msg.queue, inflight_lease_ms=int(self.settings.inflight_lease_s * 1000),
            delivery=self.token, after=self.after,
        )  # fmt: skip
        self.loaded = loaded.kind == "go"
        if self.loaded and self.msg.version > 1:  # from the commit before to this start
            if self.claimed is not None:
                metrics.turn_gap(time.monotonic() - self.committed_at, eager=True)
            else:
                metrics.turn_gap(loaded.gap_ms / 1000, eager=False)
        if loaded.kind != "go":
            log.info(
                "step_skipped",
                why=loaded.kind,
                current_version=loaded.version,
                status=loaded.status,
            )
            return loaded.kind
        if loaded.attempts > self.settings.max_step_attempts:
            reason = (
                f"step {self.msg.version} was delivered {loaded.attempts} times without a "
                "commit: its turn keeps killing the worker"
            )
            self.fail(loaded, reason, self._parse(loaded))
            return "poison"
        try:
            state = RunState.from_json(loaded.state)
            job = self.services.with_mcp(self.services.jobs.get(state.job), state.tenant)
        except (StateFormatError, UnknownJobError) as exc:
            self.fail(loaded, str(exc))
            return "broken"
        structlog.contextvars.bind_contextvars(step=state.usage.steps + 1)
        start(state)  # a run of a conversation that waited for its turn: it has come
        return self._gate_and_turn(loaded, state, job)

    def _parse(self, loaded: Loaded) -> RunState | None:
        try:
            return RunState.from_json(loaded.state)
        except StateFormatError:
            return None

    def _gate_and_turn(self, loaded: Loaded, state: RunState, job: Job) -> str:
        if loaded.cancel_by:
            at, reason = now_iso(), loaded.cancel_reason or "cancelled"
            cancel(state, by=loaded.cancel_by, at=at, reason=reason)
            decision = {"type": "decision", "kind": "cancelled", "by": loaded.cancel_by, "at": at,
                        "reason": reason}  # fmt: skip
            self.finish_now(loaded, state, job, [decision], clear=["cancel_by", "cancel_reason"])
            return "cancelled"
        if loaded.supersede_by:
            self.finish_now(loaded, state, job, [self._supersede(state, loaded.supersede_by)])
            return "superseded"
        if loaded.tenant_paused or loaded.queue_paused or loaded.queue_draining:
            self.park(loaded, state)
            return "parked"
        try:
            model = model_for_run(job, state.params, self.settings.providers)
        except Exception as exc:  # the job's code, or a model string this worker cannot use
            return self._unbuildable(loaded, state, job, exc)
        return self._admit_and_turn(loaded, state, job, model)

    def _supersede(self, state: RunState, by_run: str) -> dict[str, Any]:
        """End the run `superseded` (a newer run of its conversation interrupted it); its
        event."""
        at = now_iso()
        supersede(state, by_run=by_run, at=at)
        log.info("run_superseded", by_run=by_run)
        return {"type": "superseded", "by_run": by_run, "at": at}

    def _take_followups(self, loaded: Loaded, state: RunState) -> None:
        """The messages merged into the run since its last turn, into its state: this turn's
        view shows them, and its commit consumes exactly these (see run_commit.lua)."""
        if not loaded.followups:
            return
        try:
            taken = msgspec.json.decode(loaded.followups, type=list[FollowUp])
        except msgspec.DecodeError as exc:  # never written so: say so, and leave them be
            log.error("followups_unreadable", error=str(exc))
            return
        receive(state, taken)
        self.followups_seen = len(taken)

    def _unbuildable(self, loaded: Loaded, state: RunState, job: Job, exc: Exception) -> str:
        """The run's model cannot be built here: the run ends `error` now, with the exception's
        type and message. Trying again on another delivery would only fail the same way."""
        text = " ".join(str(exc).split())
        reason = excerpt(
            f"the run's model could not be built: {type(exc).__name__}"
            + (f": {text}" if text else ""),
            300,
        )
        log.error(
            "model_unbuildable", reason=reason, exc_info=not isinstance(exc, ProviderConfigError)
        )
        finish(state, Outcome.ERROR, reason, "model.build")
        self.finish_now(loaded, state, job, [])
        return "broken"

    def _admit_and_turn(self, loaded: Loaded, state: RunState, job: Job, model: Model) -> str:
        step_no = state.usage.steps + 1
        _, hard_s = time_limits(state, self.settings)
        self._take_followups(loaded, state)
        view = job.view(state)  # rendered once: it sizes the hold and is the model's input
        unfit, worst = exposure(state, job, view)
        holds: list[tuple[str, Usage]] = []
        if unfit is None:
            reservation_id = hold_id(state.run_id, step_no, self.msg.version)
            result = self._hold(loaded, reservation_id, worst, hard_s)
            if result.status == "unavailable":
                raise LedgerDown(result.detail)
            if not result.admitted:
                dimension = result.first_rejected or "conflict"
                reason = f"the tenant's {dimension} ceiling has no room for the next turn"
                log.info("tenant_budget_refused", dimension=dimension, status=result.status)
                metrics.tenant_refused(dimension)
                finish(state, Outcome.BUDGET_EXHAUSTED, reason, f"tenant.{dimension}")
                self.finish_now(loaded, state, job, [])
                return "refused"
            soft = [d for d in result.soft_exceeded if f"{TENANT}{d}" in state.extendable]
            held = self._soft_hold(state, worst, soft) if soft else None
            if held is not None:
                return self._suspend_for_soft(loaded, state, job, held, (reservation_id, worst))
            holds.append((reservation_id, worst))
            deferred = self._rate_limit(loaded, state, job, worst)
            if deferred is not None:
                return deferred
        return self._turn(loaded, state, job, holds, hard_s, view=view, model=model)

    # -- provider rate limits (worker/scheduling/ratelimits.py) ------------------------------

    def _rate_limit(self, loaded: Loaded, state: RunState, job: Job, worst: Usage) -> str | None:
        """Draw the turn's request and tokens from its model endpoint's shared buckets, when
        the endpoint has limits. None: the turn goes now. Otherwise what the step returns: the
        turn is deferred until the bucket refills (or the run ends, if its deadline would pass
        while it waits)."""
        buckets = self.services.buckets
        endpoint = job.model_spec(state.params)
        if buckets is None or endpoint is None or not buckets.limited(endpoint):
            return None
        left_ms = max(0, state.budget.deadline_ms - state.usage.elapsed_ms)
        drawn = buckets.draw(
            endpoint,
            self.msg.tenant,
            self.msg.run_id,
            self.msg.version,
            tokens=worst.tokens,
            longest_ms=left_ms,
        )
        if drawn.kind == "go":
            self.drawn = (endpoint, worst.tokens)
            return None
        wait_s = drawn.wait_ms / 1000
        event = {
            "type": "rate_limited", "endpoint": endpoint, "limit": drawn.which,
            "wait_ms": drawn.wait_ms, "step": state.usage.steps + 1, "at": now_iso(),
        }  # fmt: skip
        if self.claimed is not None:
            event["eager"] = True  # claimed by the commit before: its draw came first all the same
        if drawn.kind == "late":
            reason = (
                f"the run's deadline would pass while it waits {wait_s:.1f} s for the rate "
                f"limit of {endpoint} ({drawn.which})"
            )
            log.info("rate_limit_late", endpoint=endpoint, limit=drawn.which, wait_ms=drawn.wait_ms)
            finish(state, Outcome.BUDGET_EXHAUSTED, reason, Resource.DEADLINE)
            committed = self.finish_now(loaded, state, job, [{**event, "ended": True}])
            if committed.kind == "ok":
                metrics.run_finished(Outcome.BUDGET_EXHAUSTED.value, Resource.DEADLINE.value)
            return "finished" if committed.kind == "ok" else committed.kind
        return self._defer(loaded, state, job, drawn, event)

    def _defer(
        self, loaded: Loaded, state: RunState, job: Job, drawn: ratelimits.Draw,
        event: dict[str, Any],
    ) -> str:  # fmt: skip
        """Commit the wait and hold nothing through it: the commit releases the turn's ledger
        hold, the delivery gives its slot back when it returns, and the run's next step waits
        in its tenant's deferred set for the dispatcher (or, fair share off, for the sweeper
        once the run's lease, set to the wait, lapses). The wait counts as the run's active
        time, as a call's latency would."""
        state.usage.elapsed_ms += drawn.wait_ms
        event["until"] = datetime.fromtimestamp(time.time() + drawn.wait_ms / 1000, UTC).isoformat(
            timespec="milliseconds"
        )
        endpoint = str(event["endpoint"])
        reason = (
            f"waiting {drawn.wait_ms / 1000:.1f} s for the rate limit of {endpoint} ({drawn.which})"
        )
        fair_share = self.settings.fair_share
        lease = drawn.wait_ms + (int(self.settings.pickup_lease_s * 1000) if fair_share else 0)
        hold = next_hold(
            self.services.ledger, self.settings, state, job, version=self.msg.version + 1
        )
        summary = {**self._summary(state), "reason": reason}
        committed = self.services.store.commit(
            self._change(state, loaded, lease_ms=lease, events=[event], hold=hold, **summary)
        )
        if committed.kind == "stale":
            log.info("turn_discarded", why="another delivery committed this version first")
            return "stale"
        if committed.kind != "ok":
            log.error("commit_failed", kind=committed.kind, detail=committed.detail)
            return f"commit_{committed.kind}"
        log.info("rate_limit_deferred", endpoint=endpoint, limit=drawn.which,
                 wait_ms=drawn.wait_ms)  # fmt: skip
        metrics.rate_deferred(endpoint, drawn.which, drawn.wait_ms / 1000)
        if fair_share:
            soft_s, hard_s = time_limits(state, self.settings)
            try:
                ratelimits.defer(
                    self.services.store.client, self._following, soft_s, hard_s, drawn.wait_ms
                )
            except Exception as exc:  # the run's lease lapses after the wait: the sweeper sends it
                log.warning("defer_failed", error=str(exc))
        return "deferred"

    def _soft_hold(self, state: RunState, worst: Usage, soft: list[str]) -> HeldBudget | None:
        """The hold of a run whose turn would take the tenant past soft ceilings it (or the
        job) made extendable: what the tenant spent and holds (the turn's own hold left out),
        what the turn needs, the ceiling. None if no such ceiling is left."""
        ledger = self.services.ledger.read(self.msg.tenant)
        amounts = ledger_amounts(worst)
        rows = {}
        for d in soft:
            row = ledger.get(d)
            if row is not None and row.ceiling is not None and not row.hard:
                used = max(0, row.committed + row.reserved - amounts.get(d, 0))
                rows[f"{TENANT}{d}"] = (used, amounts.get(d, 0), row.ceiling)
        if not rows:
            return None
        reason = "the next turn would pass the tenant's soft " + ", ".join(soft) + " ceiling"
        return tenant_hold(state, rows, reason)

    def _suspend_for_soft(
        self, loaded: Loaded, state: RunState, job: Job, held: HeldBudget,
        hold: tuple[str, Usage],
    ) -> str:  # fmt: skip
        """Give the turn's hold back and suspend the run `needs_budget` before anything ran."""
        reservation_id, worst = hold
        state.held_budget = held
        finish(state, Outcome.NEEDS_BUDGET, held.reason, ",".join(held.dimensions))
        zero = {d: 0 for d in ledger_amounts(worst)}
        give_back = self.services.ledger.settle_script_args(state.tenant, reservation_id, zero)[1]
        log.info("tenant_soft_ceiling_holds_run", dimensions=held.dimensions)
        committed = self.finish_now(loaded, state, job, [], settlements=[give_back])
        return self._next(committed, state, Suspended(held))

    def _hold(
        self, loaded: Loaded, reservation_id: str, worst: Usage, hard_s: float
    ) -> ReserveResult:
        """The ledger's answer for this turn's hold: the one the load took, or, for a run that
        carries no hold (one written before holds were), a reservation taken now."""
        ledger = self.services.ledger
        if loaded.hold in ("admitted", "rejected", "conflict") and loaded.hold_id == reservation_id:
            if ledger_replies.needs_index(loaded.hold_reply):
                ledger.index_tenant(self.msg.tenant)
            return ledger_replies.reserve(loaded.hold_reply)
        _, argv = ledger.reserve_script_args(
            self.msg.tenant, reservation_id, ledger_amounts(worst), timeout_s=hard_s
        )
        taken = self.services.store.hold(self.msg.tenant, self.msg.run_id, self.msg.version, argv)
        if taken is None:  # the run moved on since the load: this turn will not commit
            return ReserveResult(status="conflict", admitted=False, detail="the run moved on")
        return taken

    def _turn(
        self,
        loaded: Loaded,
        state: RunState,
        job: Job,
        holds: list[tuple[str, Usage]],
        hard_s: float,
        *,
        view: str,
        model: Model,
    ) -> str:
        before = msgspec.structs.replace(state.usage)
        soft_s, _ = time_limits(state, self.settings)
        clock = ActiveClock(state.usage.elapsed_ms / 1000)
        trace = Trace(clock)
        gate = LedgerGate(
            self.services.store,
            self.msg,
            hold_id(state.run_id, before.steps + 1, self.msg.version) + ":x",
            hard_s,
        )
        runtime = Runtime(
            job=job, model=model, clock=clock, trace=trace, gate=gate,
            pool=self.services.pool,
        )  # fmt: skip
        try:
            with (
                self.services.heartbeat.beating(self._renew_lease),
                pools.soft_limit(soft_s, SoftTimeLimitExceeded),
            ):
                move = turn(state, runtime, view=view)
        except SoftTimeLimitExceeded:
            state, move = self._out_of_time(loaded)
            if self.followups_seen:  # the state as loaded, with what this turn took in
                self.followups_seen = 0
                self._take_followups(loaded, state)
            actual = sum((h for _, h in holds), Usage())  # worst case: nothing more is known
        else:
            actual = state.usage - before
        finally:
            runtime.close()
        if gate.reserved is not None:
            holds.append((gate.reservation_id, gate.reserved))
        if self.drawn is not None and self.services.buckets is not None:
            endpoint, drawn_tokens = self.drawn
            self.services.buckets.refund(endpoint, self.msg.tenant, drawn_tokens - actual.tokens)
        settlements = [
            self.services.ledger.settle_script_args(state.tenant, rid, ledger_amounts(share))[1]
            for rid, share in split_actual(actual, holds)
        ]
        event = {
            "type": "turn", "step": state.usage.steps, "version": self.msg.version + 1,
            "status": state.status.value, "usage": msgspec.to_builtins(actual),
            "totals": msgspec.to_builtins(state.usage), "last_result": state.last_result,
            "spans": msgspec.to_builtins(trace.spans), "at": now_iso(),
        }  # fmt: skip
        event.update(answered_by(trace))
        if self.followups_seen:
            event["followups_seen"] = self.followups_seen
        if self.claimed is not None:
            event["eager"] = True  # run at once by the worker whose commit claimed it
        committed = self.finish_now(loaded, state, job, [event], settlements=settlements)
        done = self._next(committed, state, move)
        spec = job.model_spec(state.params) or str(state.params.get("model") or "") or None
        exporter = self.services.tracing
        exporter.export_turn(self._traceparent, trace.spans, clock, run_id=state.run_id, model=spec)
        if isinstance(move, Finished):
            exporter.export_run_end(self._traceparent, state, spec)
        return done

    @property
    def _traceparent(self) -> str:
        return self.msg.traceparent or tracing.run_traceparent(self.msg.run_id)

    def _cancel_if_requested(self, version: int, state: RunState) -> str | None:
        """A cancel requested while the turn ran (or an interrupt by a newer run of the run's
        conversation) finds the run suspended, where no step will come to see it: honour it
        now, through the same compare-and-set (an operator's decision that got there first
        wins)."""
        by, reason, stored, by_run = self.services.store.client.hmget(
            keys.run(self.msg.tenant, self.msg.run_id), "cancel_by", "cancel_reason", "version",
            "supersede_by",
        )  # fmt: skip
        if not (by or by_run) or str(stored) != str(version):
            return None
        if by:
            at, why = now_iso(), str(reason or "cancelled")
            cancel(state, by=str(by), at=at, reason=why)
            event = {"type": "decision", "kind": "cancelled", "by": str(by), "at": at,
                     "reason": why}  # fmt: skip
        else:
            event = self._supersede(state, str(by_run))
        left = self.services.store.leave(
            tenant=self.msg.tenant, run_id=self.msg.run_id, version=version,
            old_status=Status.SUSPENDED.value, state=state, events=[event],
            clear=["cancel_by", "cancel_reason"],
        )  # fmt: skip
        if left.kind != "ok":
            return None
        return "cancelled" if by else "superseded"

    def _renew_lease(self) -> None:
        self.services.store.renew(
            tenant=self.msg.tenant, run_id=self.msg.run_id, queue=self.msg.queue,
            lease_ms=int(self.settings.inflight_lease_s * 1000),
        )  # fmt: skip

    def _out_of_time(self, loaded: Loaded) -> tuple[RunState, Move]:
        """The soft limit fired inside the turn: something ignored its timeout. Start again
        from the state as loaded and end the run; if an approved held call may have run, its
        outcome is unknown, otherwise the run ran out of time."""
        state = RunState.from_json(loaded.state)
        state.usage.elapsed_ms = state.budget.deadline_ms
        if state.pending is not None:
            state.unconfirmed = state.pending.call.plan_step or state.pending.call.name
            reason = "the turn outlived its time limit while an approved call may have run"
            return state, finish(state, Outcome.UNKNOWN_OUTCOME, reason)
        reason = "the turn outlived its time limit: a call ignored its timeout"
        return state, finish(state, Outcome.BUDGET_EXHAUSTED, reason, Resource.DEADLINE)

    def _next(self, committed: Committed, state: RunState, move: Move) -> str:
        if committed.kind == "stale":
            log.info("turn_discarded", why="another delivery committed this version first")
            return "stale"
        if committed.kind != "ok":
            log.error("commit_failed", kind=committed.kind, detail=committed.detail)
            return f"commit_{committed.kind}"
        if isinstance(move, Continue):
            if not committed.queued and committed.claimed is None:
                self.services.send(self._following, state)
            return "continued"
        if isinstance(move, Suspended):
            if isinstance(move.held, HeldBudget):
                log.info("run_suspended", needs_budget=move.held.dimensions)
            else:
                log.info("run_suspended", tool=move.held.call.name)
            return self._cancel_if_requested(committed.version, state) or "suspended"
        assert isinstance(move, Finished)
        log.info("run_finished", outcome=move.outcome.value, detail=move.detail)
        metrics.run_finished(move.outcome.value, move.detail)
        return "finished"
