"""What a step returns, for the task, the log, the metrics and the tests: a closed set, whose
values are the words a step has always said (`str(StepResult.CONTINUED) == "continued"`)."""

from __future__ import annotations

from enum import StrEnum


class StepResult(StrEnum):
    # The turn's commit, and what follows it.
    CONTINUED = "continued"  # the run's next step queued, claimed (eager) or sent
    SUSPENDED = "suspended"  # held for a person: a call to approve, or a budget to extend
    FINISHED = "finished"  # ended with its outcome
    DEFERRED = "deferred"  # its next step waits for its model endpoint's rate limit
    # A gate's end or wait, before the turn.
    REFUSED = "refused"  # the tenant's ledger had no room for the turn: `budget_exhausted`
    CANCELLED = "cancelled"  # a cancel asked for while a turn ran, honoured at the boundary
    SUPERSEDED = "superseded"  # a newer run of its conversation interrupted it
    PARKED = "parked"  # its tenant or queue is paused, or the queue draining
    BROKEN = "broken"  # its state, job or model cannot be used here: ended `error`
    POISON = "poison"  # delivered too often without a commit: ended `error`
    # The load found nothing to do (run_load.lua), or another delivery committed first.
    MISSING = "missing"
    STALE = "stale"
    IDLE = "idle"
    BUSY = "busy"
    # The commit did not take (run_commit.lua's refusals other than `stale`).
    COMMIT_MISSING = "commit_missing"
    COMMIT_LEDGER = "commit_ledger"
    COMMIT_BUSY = "commit_busy"
    COMMIT_MOVED = "commit_moved"
    # A rate limit's late end whose commit did not take says the commit's kind as it is.
    LEDGER = "ledger"
    MOVED = "moved"


# Results after which the step's run is over: its fair-share slot is given back for good.
RUN_ENDED = frozenset(
    {
        StepResult.FINISHED,
        StepResult.REFUSED,
        StepResult.CANCELLED,
        StepResult.SUPERSEDED,
        StepResult.BROKEN,
        StepResult.POISON,
        StepResult.MISSING,
    }
)
