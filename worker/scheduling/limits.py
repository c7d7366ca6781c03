"""What a step may take, as whoever queues it computes it: its soft and hard time limits and
the ledger hold its turn reserves in its load. The client computes them for a run's first step
and a decision's, the sweeper for a step it sends again, the step for the next one. So they
live with the rest of queueing a step, not in the worker's runtime: a service that submits
imports nothing of the worker process's side, and none of them needs Celery for it.
"""

from __future__ import annotations

import msgspec

from turnstile.jobs.budget import Usage
from turnstile.jobs.job import Job
from turnstile.jobs.kernel import exposure
from turnstile.jobs.state import RunState
from turnstile.ledger.client import Ledger
from turnstile.worker.settings import Settings


def time_limits(state: RunState, settings: Settings) -> tuple[float, float]:
    """(soft, hard) time limits of the run's next step: the run's remaining active time plus a
    grace, so that a call ignoring its own timeout is still stopped from outside."""
    remaining_s = max(0, state.budget.deadline_ms - state.usage.elapsed_ms) / 1000
    hard = min(remaining_s, settings.max_deadline_s) + settings.step_grace_s
    return max(1.0, hard - settings.soft_margin_s), hard


def ledger_amounts(usage: Usage) -> dict[str, int]:
    """The built-in four dimensions and whatever job dimensions the usage carries."""
    return usage.ledger_amounts()


def hold_id(run_id: str, step: int, version: int) -> str:
    """The reservation id of a turn: "<run>:<step>", qualified by the version of the step
    message that takes it. A redelivered message takes the same hold again (the ledger
    replays it); after a park released a hold, the resumed run takes a new one."""
    return f"{run_id}:{step}:v{version}"


def next_hold(
    ledger: Ledger, settings: Settings, state: RunState, job: Job, *, version: int,
    hard_s: float | None = None,
) -> str:  # fmt: skip
    """The ledger hold the run's next turn will take, as the load script reads it: computed
    whenever the run is committed live, for the step message of `version`, so that step
    reserves inside its one read. It is the worst case of the next turn (the kernel's
    exposure), held until the step's hard time limit (`hard_s`, when the caller has it
    already) has passed."""
    unfit, worst = exposure(state, job)
    if unfit is not None:
        return msgspec.json.encode({"unfit": unfit.value}).decode()
    if hard_s is None:
        _, hard_s = time_limits(state, settings)
    reservation_id = hold_id(state.run_id, state.usage.steps + 1, version)
    _, argv = ledger.reserve_script_args(
        state.tenant, reservation_id, ledger_amounts(worst), timeout_s=hard_s
    )
    return msgspec.json.encode({"argv": argv}).decode()
