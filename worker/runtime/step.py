"""One step of a run, in its order: load, the gates, the turn, its commit, what follows.

The Celery task only parses its message and calls `Step(...).run()`; `run` reads as the order.
The gates a turn passes before its model is called are in worker/runtime/gates.py, the writes
in worker/runtime/commits.py, the ledger holds in worker/runtime/holds.py and eager
continuation in worker/runtime/eager.py: plain Python over the store, the ledger and the kernel.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field

import msgspec
import structlog
from celery.exceptions import SoftTimeLimitExceeded

from turnstile.jobs.budget import Usage
from turnstile.jobs.clock import ActiveClock
from turnstile.jobs.conversations import start
from turnstile.jobs.errors import StateFormatError, UnknownJobError
from turnstile.jobs.kernel import turn
from turnstile.jobs.live import NO_LIVE
from turnstile.jobs.moves import Finished, Move, finish
from turnstile.jobs.outcomes import Outcome, Resource
from turnstile.jobs.recording import Answering, answering
from turnstile.jobs.runtime import Runtime
from turnstile.jobs.state import RunState
from turnstile.jobs.trace import Trace
from turnstile.worker.broker.message import StepMessage
from turnstile.worker.runtime import pools
from turnstile.worker.runtime.commits import Took, Writer, parse
from turnstile.worker.runtime.eager import Chain
from turnstile.worker.runtime.gates import GATES, Turn, through
from turnstile.worker.runtime.holds import LedgerGate, settlements
from turnstile.worker.runtime.live import StoreSink
from turnstile.worker.runtime.results import StepResult
from turnstile.worker.runtime.services import Services
from turnstile.worker.scheduling.limits import hold_id, time_limits
from turnstile.worker.settings import Settings
from turnstile.worker.store.records import InFlight
from turnstile.worker.store.runs import Loaded, now_iso

log = structlog.get_logger("turnstile.step")


@dataclass
class Step:
    """One delivery of a step message being handled, or one turn its commit claimed (eager
    continuation: the run's next step, run by the same task at once, see run_commit.lua)."""

    services: Services
    msg: StepMessage
    chain: Chain = field(default_factory=Chain)  # its delivery's turns (runtime/eager.py)
    after: str = ""  # the earlier delivery of this step that exited cleanly, if any
    claimed: Loaded | None = None  # this turn's load, done by the commit that claimed it
    loaded: bool = False  # whether this delivery's load ran (and so counted as an attempt)
    # This delivery, as its load records it: the message, and a nonce, since a message
    # redelivered after a kill is the same message but another delivery.
    token: str = ""
    writer: Writer | None = None  # this turn's writes, once its load let it go
    answered: Answering | None = None  # an evaluation run's tools, answering from a recording

    def __post_init__(self) -> None:
        self.token = self.token or f"{self.chain.delivery}.{secrets.token_hex(4)}"

    @property
    def clean_exit(self) -> str:
        """What a retry of this delivery names as `after`: this delivery if its load counted
        it, else whatever this one was given."""
        return self.token if self.loaded else self.after

    @property
    def settings(self) -> Settings:
        return self.services.settings

    @property
    def following(self) -> Step | None:
        """The run's next turn, when this one's commit claimed it: the task runs it next."""
        took: Took | None = self.writer.took if self.writer is not None else None
        if took is None:
            return None
        return Step(self.services, took.msg, self.chain.then(), claimed=took.loaded,
                    token=took.token)  # fmt: skip

    def run(self) -> StepResult:
        """Handle the delivery: load, then the turn's gates in order (each goes on, or ends or
        waits the run and says the step's result), then the turn and its commit. Returns what
        happened, for the log, the metrics and the tests."""
        loaded = self._load()
        if loaded.kind != "go":
            log.info("step_skipped", why=loaded.kind, current_version=loaded.version,
                     status=loaded.status)  # fmt: skip
            return StepResult(loaded.kind)
        writer = self.writer = Writer(self.services, self.msg, loaded, self.chain)
        if loaded.attempts > self.settings.max_step_attempts:
            writer.fail(f"step {self.msg.version} was delivered {loaded.attempts} times without "
                        "a commit: its turn keeps killing the worker", parse(loaded))  # fmt: skip
            return StepResult.POISON
        try:
            state = RunState.from_json(loaded.state)
            job = self.services.with_mcp(self.services.jobs.get(state.job), state.tenant)
        except (StateFormatError, UnknownJobError) as exc:
            writer.fail(str(exc))
            return StepResult.BROKEN
        self.answered = answering(job, state)  # the job itself, for a run with no recording
        job = self.answered.job
        structlog.contextvars.bind_contextvars(step=state.usage.steps + 1)
        start(state)  # a run of a conversation that waited for its turn: it has come
        limits = time_limits(state, self.settings)
        this = Turn(writer, state, job, limits, eager=self.claimed is not None)
        # A cancel, an interrupt, a pause, the job version, the model, admission, soft
        # ceilings, rate limits.
        stopped = through(this, GATES)
        if stopped is not None:
            return stopped.result
        return self._turn(this)

    def _load(self) -> Loaded:
        """The run at the message's version, gated and loaded in one script (run_load.lua), or
        as the commit that claimed this turn loaded it."""
        loaded = self.claimed or self.services.store.load(
            tenant=self.msg.tenant, run_id=self.msg.run_id, version=self.msg.version,
            queue=self.msg.queue, inflight_lease_ms=int(self.settings.inflight_lease_s * 1000),
            delivery=self.token, after=self.after,
        )  # fmt: skip
        self.loaded = loaded.kind == "go"
        if self.loaded and self.msg.version > 1:  # from the commit before to this start
            self.chain.gap(loaded, claimed=self.claimed is not None)
        return loaded

    # -- the turn ---------------------------------------------------------------------------

    def _turn(self, this: Turn) -> StepResult:
        """One kernel turn under the turn's soft limit, with its lease renewed; its holds
        settled on the actual usage, its event and its commit, then what follows."""
        state, writer, job = this.state, this.writer, this.job
        assert this.model is not None
        before = msgspec.structs.replace(state.usage)
        clock = ActiveClock(state.usage.elapsed_ms / 1000)
        trace = Trace(clock)
        soft_s, hard_s = this.limits
        gate = LedgerGate(
            self.services.store, self.msg,
            hold_id(state.run_id, before.steps + 1, self.msg.version) + ":x", hard_s,
        )  # fmt: skip
        sink = self._live(state)
        runtime = Runtime(job=job, model=this.model, clock=clock, trace=trace, gate=gate,
                          pool=self.services.pool, live=sink or NO_LIVE)  # fmt: skip
        try:
            with (
                self.services.heartbeat.beating(self._in_flight()),
                pools.soft_limit(soft_s, SoftTimeLimitExceeded),
            ):
                move = turn(state, runtime, view=this.view)
                if self.answered is not None:  # an evaluation's call not in its recording
                    move = self.answered.settle(state, move)
        except SoftTimeLimitExceeded:
            if sink is not None:
                sink.abandon("the turn outlived its time limit")
            state, move = self._out_of_time(writer.loaded)
            if writer.followups_seen:  # the state as loaded, with what this turn took in
                writer.followups_seen = 0
                writer.take_followups(state)
            actual = sum((h for _, h in this.holds), Usage())  # worst case: nothing more known
        else:
            actual = state.usage - before
        finally:
            runtime.close()
            if sink is not None:
                sink.close()  # its last words before its commit
        if gate.reserved is not None:
            this.holds.append((gate.reservation_id, gate.reserved))
        if this.drawn is not None and self.services.buckets is not None:
            endpoint, drawn_tokens = this.drawn
            self.services.buckets.refund(endpoint, self.msg.tenant, drawn_tokens - actual.tokens)
        settled = settlements(self.services.ledger, state.tenant, actual, this.holds)
        event = {
            "type": "turn", "step": state.usage.steps, "version": self.msg.version + 1,
            "status": state.status.value, "usage": msgspec.to_builtins(actual),
            "totals": msgspec.to_builtins(state.usage), "last_result": state.last_result,
            "spans": msgspec.to_builtins(trace.spans), "at": now_iso(), **answered_by(trace),
        }  # fmt: skip
        if writer.followups_seen:
            event["followups_seen"] = writer.followups_seen
        if this.eager:
            event["eager"] = True  # run at once by the worker whose commit claimed it
        committed = writer.commit(state, job, [event], settlements=settled)
        done = writer.next(committed, state, move)
        spec = this.spec or str(state.params.get("model") or "") or None
        exporter = self.services.tracing
        exporter.export_turn(
            writer.traceparent, trace.spans, clock, run_id=state.run_id, model=spec
        )
        if isinstance(move, Finished):
            exporter.export_run_end(writer.traceparent, state, spec)
        return done

    def _live(self, state: RunState) -> StoreSink | None:
        """The turn's live sink (worker/runtime/live.py), tagged with this delivery's attempt
        at the turn; None when live output is off or nobody read the run live when the turn
        was loaded (then the model is not streamed: the turn costs what it does with live
        output off; the load told whether anyone reads, see run_load.lua)."""
        assert self.writer is not None
        if not self.settings.live_output or not self.writer.loaded.watched:
            return None
        return StoreSink(
            self.services.store.client, self.settings, tenant=state.tenant,
            run_id=state.run_id, turn=state.usage.steps + 1,
            attempt=max(1, self.writer.loaded.attempts),
        )  # fmt: skip

    def _in_flight(self) -> InFlight:
        """This turn, as the heartbeat renews its in-flight lease."""
        return InFlight(
            self.msg.tenant, self.msg.run_id, self.msg.queue,
            int(self.settings.inflight_lease_s * 1000),
        )  # fmt: skip

    @staticmethod
    def _out_of_time(loaded: Loaded) -> tuple[RunState, Move]:
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


def answered_by(trace: Trace) -> dict[str, str]:
    """Which model answered the turn (and why a fallback did), for its event, when known."""
    span = next((s for s in trace.spans if s.kind == "model"), None)
    attrs = span.attrs if span is not None else {}
    return {k: str(attrs[k]) for k in ("model", "fallback") if attrs.get(k)}
