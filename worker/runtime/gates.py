"""The gates a turn passes before its model is called, in order (`GATES`), each answering go,
end or wait, as dramatiq's middleware and Temporal's interceptors do around a message: the
step (worker/runtime/step.py) runs them one after the other and stops at the first that does
not answer go. A gate that ends or waits has committed what it decided (through the turn's
`Writer`); its answer carries the step's result."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import structlog

from turnstile.jobs.budget import Usage
from turnstile.jobs.decisions import cancel
from turnstile.jobs.extensions import TENANT
from turnstile.jobs.job import Job
from turnstile.jobs.kernel import exposure
from turnstile.jobs.model import Model
from turnstile.jobs.moves import Suspended, finish
from turnstile.jobs.outcomes import Outcome, Resource
from turnstile.jobs.state import RunState
from turnstile.jobs.versions import Meeting, meets, migrated
from turnstile.providers.errors import ProviderConfigError
from turnstile.providers.runs import model_for_run
from turnstile.worker.observability import metrics
from turnstile.worker.runtime import holds
from turnstile.worker.runtime.commits import Writer, superseded
from turnstile.worker.runtime.results import StepResult
from turnstile.worker.runtime.services import Services
from turnstile.worker.scheduling import ratelimits
from turnstile.worker.scheduling.limits import hold_id
from turnstile.worker.store import versions as job_versions
from turnstile.worker.store.runs import excerpt, now_iso
from turnstile.worker.store.versions import WAITING_FOR_VERSION

log = structlog.get_logger("turnstile.step")


@dataclass
class Turn:
    """A turn as its gates see it and fill it in, on its way to the kernel."""

    writer: Writer
    state: RunState
    job: Job
    limits: tuple[float, float]  # the turn's (soft, hard) time limits, computed once
    eager: bool = False  # claimed by the commit before it (its events say so)
    model: Model | None = None  # built by `model_built`
    spec: str | None = None  # the model it names (its endpoint's rate limits), if a provider's
    view: str = ""  # rendered once by `admission`: it sizes the hold and is the model's input
    unfit: Resource | None = None  # the run's own budget's first dimension the turn won't fit
    worst: Usage = field(default_factory=Usage)  # the turn's worst case, as the ledger holds it
    holds: list[tuple[str, Usage]] = field(default_factory=list)  # (reservation id, amounts)
    soft_exceeded: list[str] = field(default_factory=list)  # soft ceilings the run may extend
    drawn: tuple[str, int] | None = None  # the rate-limited endpoint and the tokens drawn

    @property
    def services(self) -> Services:
        return self.writer.services


@dataclass(frozen=True)
class Go:
    """On to the next gate, then the turn."""


@dataclass(frozen=True)
class End:
    """The gate ended the run (committed): the step returns `result`."""

    result: StepResult


@dataclass(frozen=True)
class Wait:
    """The gate committed a wait: the run parks, is held for a person, or its next step waits
    for its model endpoint's buckets; the step returns `result`."""

    result: StepResult


GO = Go()
Verdict = Go | End | Wait
Gate = Callable[[Turn], Verdict]


def cancel_requested(turn: Turn) -> Verdict:
    """A cancel asked for while a turn was in flight: the run ends `cancelled` here."""
    loaded, state = turn.writer.loaded, turn.state
    if not loaded.cancel_by:
        return GO
    at, reason = now_iso(), loaded.cancel_reason or "cancelled"
    cancel(state, by=loaded.cancel_by, at=at, reason=reason)
    decision = {"type": "decision", "kind": "cancelled", "by": loaded.cancel_by, "at": at,
                "reason": reason}  # fmt: skip
    turn.writer.commit(state, turn.job, [decision], clear=["cancel_by", "cancel_reason"])
    return End(StepResult.CANCELLED)


def interrupted(turn: Turn) -> Verdict:
    """A newer run of the run's conversation interrupted it: it ends `superseded` here."""
    by_run = turn.writer.loaded.supersede_by
    if not by_run:
        return GO
    turn.writer.commit(turn.state, turn.job, [superseded(turn.state, by_run)])
    return End(StepResult.SUPERSEDED)


def paused(turn: Turn) -> Verdict:
    """Its tenant or its queue is paused, or the queue draining: the run parks (`resume`
    brings it back)."""
    loaded = turn.writer.loaded
    if not (loaded.tenant_paused or loaded.queue_paused or loaded.queue_draining):
        return GO
    turn.writer.park(turn.state)
    return Wait(StepResult.PARKED)


def versioned(turn: Turn) -> Verdict:
    """The run's job version against this worker's (jobs/versions.py): the same version goes;
    one the job migrates from is migrated here, the migration recorded with the turn's first
    write; any other waits, parked, for a worker of its version (one that registers requeues
    it, scheduling/versions.py), or ends when the job says a run without a path ends. A
    migration that raises ends the run `error` with its text, its hold given back."""
    state, job = turn.state, turn.job
    meeting = meets(state.job_version, here=job.version, migrate=job.migrate, no_path=job.no_path)
    if meeting is Meeting.SAME:
        if not state.job_version:
            state.job_version = job.version  # a run made before versions: pinned from now on
        return GO
    if meeting is Meeting.MIGRATE:
        return _migrate(turn)
    wanted = state.job_version
    if meeting is Meeting.NO_PATH:
        reason = (f"job {job.name!r} version {job.version!r} has no migration from the run's "
                  f"version {wanted!r}")  # fmt: skip
        finish(state, Outcome.ERROR, reason, "version.no_path")
        turn.writer.commit(state, job, [])
        return End(StepResult.BROKEN)
    log.info("version_waiting", job=job.name, version=wanted, here=job.version)
    metrics.version_waiting(job.name, wanted)
    committed = turn.writer.park(state, why=f"{WAITING_FOR_VERSION} {wanted} of job {job.name}")
    if committed.kind == "ok":  # lost, the full pass of a heartbeat finds it all the same
        with contextlib.suppress(Exception):
            job_versions.mark_waiting(turn.services.store.client, state.tenant, state.run_id)
    return Wait(StepResult.PARKED)


def _migrate(turn: Turn) -> Verdict:
    state, job = turn.state, turn.job
    source = state.job_version
    log.info("run_migrating", job=job.name, from_version=source, to_version=job.version)
    try:
        turn.state = migrated(state, job.migrate[source], to=job.version)
    except Exception as exc:  # the job's code: its text ends the run, nothing else
        text = " ".join(str(exc).split())
        reason = excerpt(f"the migration from version {source} raised {type(exc).__name__}"
                         + (f": {text}" if text else ""), 300)  # fmt: skip
        log.error("migration_failed", reason=reason, exc_info=True)
        metrics.migrated(job.name, source, "error")
        finish(state, Outcome.ERROR, reason, "version.migration")
        turn.writer.commit(state, job, [])
        return End(StepResult.BROKEN)
    metrics.migrated(job.name, source, "ok")
    log.info("run_migrated", job=job.name, from_version=source, to_version=job.version)
    turn.writer.prelude.append({"type": "migrated", "from": source, "to": job.version,
                                "step": turn.state.usage.steps, "at": now_iso()})  # fmt: skip
    return GO


def model_built(turn: Turn) -> Verdict:
    """The run's model, built here; one that cannot be built ends the run `error` now, with the
    exception's type and message (another delivery would only fail the same way)."""
    try:
        turn.model = model_for_run(turn.job, turn.state.params, turn.services.settings.providers)
        turn.spec = turn.job.model_spec(turn.state.params)
        return GO
    except Exception as exc:  # the job's code, or a model string this worker cannot use
        text = " ".join(str(exc).split())
        reason = excerpt(
            f"the run's model could not be built: {type(exc).__name__}"
            + (f": {text}" if text else ""),
            300,
        )
        log.error(
            "model_unbuildable", reason=reason, exc_info=not isinstance(exc, ProviderConfigError)
        )
        finish(turn.state, Outcome.ERROR, reason, "model.build")
        turn.writer.commit(turn.state, turn.job, [])
        return End(StepResult.BROKEN)


def admission(turn: Turn) -> Verdict:
    """What the turn will see (the follow-ups merged since the last turn, the view rendered
    once) and its worst case, against the run's own budget, then the tenant's ledger: the hold
    the load took for it. A turn that does not fit the run's own budget goes on holding
    nothing: the kernel's turn ends the run, or suspends it `needs_budget` for a dimension
    its job or tenant made extendable. A ledger that refuses ends the run `budget_exhausted`;
    one that does not answer retries the step (LedgerDown)."""
    state, writer = turn.state, turn.writer
    writer.take_followups(state)
    turn.view = turn.job.view(state)
    turn.unfit, turn.worst = exposure(state, turn.job, turn.view)
    if turn.unfit is not None:
        return GO
    reservation_id = hold_id(state.run_id, state.usage.steps + 1, writer.msg.version)
    result = holds.turn_hold(
        turn.services.store, writer.msg, writer.loaded, reservation_id=reservation_id,
        worst=turn.worst, hard_s=turn.limits[1],
    )  # fmt: skip
    if result.status == "unavailable":
        raise holds.LedgerDown(result.detail)
    if not result.admitted:
        dimension = result.first_rejected or "conflict"
        reason = f"the tenant's {dimension} ceiling has no room for the next turn"
        log.info("tenant_budget_refused", dimension=dimension, status=result.status)
        metrics.tenant_refused(dimension)
        finish(state, Outcome.BUDGET_EXHAUSTED, reason, f"tenant.{dimension}")
        writer.commit(state, turn.job, [])
        return End(StepResult.REFUSED)
    turn.holds.append((reservation_id, turn.worst))
    turn.soft_exceeded = [d for d in result.soft_exceeded if f"{TENANT}{d}" in state.extendable]
    return GO


def soft_ceilings(turn: Turn) -> Verdict:
    """The turn's hold passed a soft ceiling of the tenant's that the run may extend: the hold
    is given back and the run suspends `needs_budget` before anything ran."""
    if not turn.holds or not turn.soft_exceeded:
        return GO
    state, ledger = turn.state, turn.services.ledger
    held = holds.soft_hold(ledger, state, turn.worst, turn.soft_exceeded)
    if held is None:
        return GO
    reservation_id, worst = turn.holds.pop()
    state.held_budget = held
    finish(state, Outcome.NEEDS_BUDGET, held.reason, ",".join(held.dimensions))
    give_back = holds.give_back(ledger, state.tenant, reservation_id, worst)
    log.info("tenant_soft_ceiling_holds_run", dimensions=held.dimensions)
    committed = turn.writer.commit(state, turn.job, [], settlements=[give_back])
    return Wait(turn.writer.next(committed, state, Suspended(held)))


def rate_limit(turn: Turn) -> Verdict:
    """The turn's request and tokens, drawn from its model endpoint's shared buckets when the
    endpoint has limits (worker/scheduling/ratelimits.py): go now; or wait until the buckets
    refill, the wait committed; or, when the run's deadline would pass while it waits, end
    `budget_exhausted`."""
    buckets, state, msg = turn.services.buckets, turn.state, turn.writer.msg
    endpoint = turn.spec
    if not turn.holds or buckets is None or endpoint is None or not buckets.limited(endpoint):
        return GO
    left_ms = max(0, state.budget.deadline_ms - state.usage.elapsed_ms)
    drawn = buckets.draw(
        endpoint, msg.tenant, msg.run_id, msg.version, tokens=turn.worst.tokens,
        longest_ms=left_ms,
    )  # fmt: skip
    if drawn.kind == "go":
        turn.drawn = (endpoint, turn.worst.tokens)
        return GO
    event = {
        "type": "rate_limited", "endpoint": endpoint, "limit": drawn.which,
        "wait_ms": drawn.wait_ms, "step": state.usage.steps + 1, "at": now_iso(),
    }  # fmt: skip
    if turn.eager:
        event["eager"] = True  # claimed by the commit before: its draw came first all the same
    if drawn.kind == "late":
        return _late(turn, drawn, event)
    return _defer(turn, drawn, event)


def _late(turn: Turn, drawn: ratelimits.Draw, event: dict[str, Any]) -> Verdict:
    """The run's deadline would pass while it waits: it ends `budget_exhausted` now."""
    endpoint = event["endpoint"]
    reason = (
        f"the run's deadline would pass while it waits {drawn.wait_ms / 1000:.1f} s for the "
        f"rate limit of {endpoint} ({drawn.which})"
    )
    log.info("rate_limit_late", endpoint=endpoint, limit=drawn.which, wait_ms=drawn.wait_ms)
    finish(turn.state, Outcome.BUDGET_EXHAUSTED, reason, Resource.DEADLINE)
    committed = turn.writer.commit(turn.state, turn.job, [{**event, "ended": True}])
    if committed.kind != "ok":  # said as the commit's kind, unlogged, as it always was
        return End(StepResult(committed.kind))
    metrics.run_finished(Outcome.BUDGET_EXHAUSTED.value, Resource.DEADLINE.value)
    return End(StepResult.FINISHED)


def _defer(turn: Turn, drawn: ratelimits.Draw, event: dict[str, Any]) -> Verdict:
    """Commit the wait and hold nothing through it: the commit releases the turn's ledger hold,
    the delivery gives its slot back when it returns, and the run's next step waits in its
    tenant's deferred set for the dispatcher (or, fair share off, for the sweeper once the
    run's lease, set to the wait, lapses). The wait counts as the run's active time, as a
    call's latency would."""
    state, writer, settings = turn.state, turn.writer, turn.services.settings
    state.usage.elapsed_ms += drawn.wait_ms
    until = datetime.fromtimestamp(time.time() + drawn.wait_ms / 1000, UTC)
    event["until"] = until.isoformat(timespec="milliseconds")
    endpoint = str(event["endpoint"])
    reason = (
        f"waiting {drawn.wait_ms / 1000:.1f} s for the rate limit of {endpoint} ({drawn.which})"
    )
    committed = writer.commit_wait(state, turn.job, event, wait_ms=drawn.wait_ms, reason=reason)
    refused = writer.refused(committed)
    if refused is not None:
        return End(refused)
    log.info("rate_limit_deferred", endpoint=endpoint, limit=drawn.which, wait_ms=drawn.wait_ms)
    metrics.rate_deferred(endpoint, drawn.which, drawn.wait_ms / 1000)
    if settings.fair_share and writer.next_limits is not None:
        try:
            ratelimits.defer(
                turn.services.store.client, writer.following, *writer.next_limits, drawn.wait_ms
            )
        except Exception as exc:  # the run's lease lapses after the wait: the sweeper sends it
            log.warning("defer_failed", error=str(exc))
    return Wait(StepResult.DEFERRED)


# The order of a turn's gates. The first five need nothing of the turn's size; admission
# sizes it and takes its hold, which the last two look at.
GATES: tuple[Gate, ...] = (
    cancel_requested,  # a cancel asked for while a turn ran: ends `cancelled`
    interrupted,  # a newer run of its conversation: ends `superseded`
    paused,  # its tenant or queue paused, or the queue draining: parks
    versioned,  # its job version not this worker's: migrates, or parks until one serves it
    model_built,  # its model cannot be built here: ends `error`
    admission,  # the run's own budget, then the tenant's ledger: ends `budget_exhausted`
    soft_ceilings,  # past a soft ceiling the run may extend: suspends `needs_budget`
    rate_limit,  # its model endpoint's buckets: waits for them, or ends at its deadline
)


def through(turn: Turn, gates: Sequence[Gate] = GATES) -> End | Wait | None:
    """The turn through its gates in order: the first answer that is not go, or None when
    every gate let it go."""
    for gate in gates:
        verdict = gate(turn)
        if not isinstance(verdict, Go):
            return verdict
    return None
