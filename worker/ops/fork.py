"""Fork a run: a new run, with its own id, budget and ledger charges, that starts from the
state another run recorded after one of its turns, rebuilt by replaying its recording to that
turn (worker/ops/replay.py), on a variant: other params (another model), another goal.

The new run's state carries its `origin` (the run and the turn) and its `submitted` event says
`forked_from` and `at_turn`; `turnstile trace` shows the link. Every refusal is one line and
starts nothing: a turn outside the run, a run still in flight, a recording that retention
removed, a variant that cannot be built.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from turnstile.errors import TurnstileError
from turnstile.jobs.errors import KernelError
from turnstile.jobs.outcomes import Status
from turnstile.jobs.recording import Mode, recorded_calls
from turnstile.jobs.state import Origin, RunState
from turnstile.providers import budget_for
from turnstile.worker.client._client import Client
from turnstile.worker.client._submit import idempotent_run_id
from turnstile.worker.names import check_run_id
from turnstile.worker.ops.decisions import resolve
from turnstile.worker.ops.errors import ForkRefusedError
from turnstile.worker.ops.replay import replay_events
from turnstile.worker.store import fields


@dataclass(frozen=True)
class Variant:
    """What a fork changes: params laid over the origin's (`model=...`), the goal."""

    params: Mapping[str, Any] | None = None
    goal: str | None = None


@dataclass(frozen=True)
class Forked:
    run_id: str
    tenant: str
    origin: str
    turn: int
    created: bool  # False: the same fork was made before (idempotent)


@dataclass(frozen=True)
class Recording:
    """A finished run's recording: its events and the turns they hold."""

    run_id: str
    tenant: str
    events: list[dict[str, Any]]

    @property
    def turns(self) -> int:
        return sum(1 for e in self.events if e.get("type") == "turn")

    def upto(self, turn: int) -> list[dict[str, Any]]:
        """The events up to and with the `turn`-th turn event (0: the submission only)."""
        seen = 0
        for index, event in enumerate(self.events):
            if event.get("type") == "turn":
                seen += 1
            if seen == turn and (turn == 0 or event.get("type") == "turn"):
                return self.events[: index + 1]
        return list(self.events)


def recording_of(c: Client, run_id: str, tenant: str | None = None) -> Recording:
    """A run that has ended and whose recording is whole, else a one-line refusal."""
    tenant, stored = resolve(c, run_id, tenant)
    status = stored.get(fields.STATUS, "")
    if status != Status.STOPPED.value:
        raise ForkRefusedError(
            f"run {run_id} is still in flight ({status}): fork or evaluate a run that has ended"
        )
    events = [event for _, event in c.store.events(tenant, run_id)]
    if not events or events[0].get("type") != "submitted":
        raise ForkRefusedError(
            f"run {run_id}'s recording was removed (retention): it cannot be rebuilt"
        )
    return Recording(run_id, tenant, events)


def state_after(c: Client, recording: Recording, turn: int) -> RunState:
    """The run's state after its `turn`-th turn, replayed from its recording; refused for a
    turn outside the run or one after which the run was not running."""
    total = recording.turns
    if isinstance(turn, bool) or not isinstance(turn, int) or not 0 <= turn < total:
        raise ForkRefusedError(
            f"turn {turn} is outside run {recording.run_id}, which has {total} turn(s): "
            f"fork at 0 (its start) to {max(0, total - 1)}"
        )
    try:
        state, _, _ = replay_events(recording.upto(turn), None, c.jobs)
    except TurnstileError as exc:
        raise ForkRefusedError(f"run {recording.run_id} cannot be rebuilt: {exc}") from exc
    if state.status is not Status.RUNNING:
        raise ForkRefusedError(
            f"after turn {turn} run {recording.run_id} was {state.status.value}, not running: "
            "fork at another turn"
        )
    return state


def variant_state(
    c: Client, state: RunState, variant: Variant, *, run_id: str, tenant: str, origin: Origin
) -> RunState:
    """The fork's state: the rebuilt one with its new id, tenant, params, goal and budget (at
    the variant model's prices), checked as a submission's would be."""
    job = c.jobs.get(state.job)
    params = {**state.params, **dict(variant.params or {})}
    try:
        job.validate_params(params)
        budget = budget_for(params, state.budget, c.config.providers, default=True, job=job)
    except (KernelError, TurnstileError) as exc:
        raise ForkRefusedError(f"the variant cannot be built: {exc}") from exc
    goal = state.goal if variant.goal is None else variant.goal
    if not isinstance(goal, str) or not goal.strip() or len(goal) > c.config.max_goal_chars:
        raise ForkRefusedError(
            f"the variant cannot be built: goal must be text of 1-{c.config.max_goal_chars} "
            "characters"
        )
    out = state.copy()
    out.run_id, out.tenant, out.params, out.goal, out.budget = run_id, tenant, params, goal, budget
    out.origin = origin
    out.conversation, out.followups = None, []  # a fork is a run of its own
    return out


def fork_run(
    c: Client,
    run_id: str,
    *,
    at: int,
    variant: Variant | None = None,
    tenant: str | None = None,
    into: str | None = None,
    queue: str = "default",
    new_run_id: str | None = None,
    evaluation: str | None = None,
    mode: Mode | None = None,
) -> Forked:
    """Start a new run from the state `run_id` recorded after turn `at` (0: its start), on the
    variant, as a run of `into` (default: the origin's tenant). With `mode`, an evaluation run:
    its tools answer from the origin's recorded calls (jobs/recording.py)."""
    recording = recording_of(c, run_id, tenant)
    state = state_after(c, recording, at)
    into = into or recording.tenant
    new_id = check_run_id(new_run_id) if new_run_id else f"run_{uuid.uuid4().hex[:20]}"
    origin = Origin(run_id=run_id, tenant=recording.tenant, turn=at, evaluation=evaluation)
    if mode is not None:
        origin.mode = Mode(mode).value
        origin.calls = recorded_calls(recording.events)
    forked = variant_state(c, state, variant or Variant(), run_id=new_id, tenant=into,
                           origin=origin)  # fmt: skip
    event = {"forked_from": run_id, "at_turn": at}
    if evaluation is not None:
        event["evaluation"] = evaluation
    submitted = c.submit_state(forked, queue=queue, event=event)
    return Forked(submitted.run_id, into, run_id, at, submitted.created)


def evaluation_run_id(tenant: str, evaluation: str, origin: str) -> str:
    """The run id of an evaluation's run of one origin: the same each time it is submitted,
    so an evaluation resumed after a crash evaluates each run once."""
    return idempotent_run_id(tenant, f"eval:{evaluation}:{origin}")
