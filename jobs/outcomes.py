"""The closed set of ways a run ends, and the names of what made it end."""

from __future__ import annotations

from enum import StrEnum


class Outcome(StrEnum):
    COMPLETED = "completed"
    BUDGET_EXHAUSTED = "budget_exhausted"
    LOOP_DETECTED = "loop_detected"
    NEEDS_APPROVAL = (
        "needs_approval"  # suspended and resumable: the only outcome that is not terminal
    )
    # suspended and resumable too: out of a budget dimension the run may have extended
    NEEDS_BUDGET = "needs_budget"
    APPROVAL_DENIED = "approval_denied"
    ESCALATED = "escalated"
    GUARDRAIL_STOP = "guardrail_stop"
    TOOL_FAILURE = "tool_failure"
    UNKNOWN_OUTCOME = "unknown_outcome"
    CANCELLED = "cancelled"
    SUPERSEDED = "superseded"  # a newer message of its conversation interrupted it
    ERROR = "error"
    DIVERGED = "diverged"  # an evaluation run met a call its recording does not have


TERMINAL: frozenset[Outcome] = frozenset(Outcome) - {Outcome.NEEDS_APPROVAL, Outcome.NEEDS_BUDGET}


class Resource(StrEnum):
    """Budget dimensions a run can exhaust, in the order admission checks them."""

    STEPS = "steps"
    TOOL_CALLS = "tool_calls"
    DEADLINE = "deadline"
    TOKENS = "tokens"
    COST = "cost"


class Detector(StrEnum):
    REPEATED_CALL = "repeated_call"
    OSCILLATION = "oscillation"
    NO_PROGRESS = "no_progress"


class Status(StrEnum):
    """Where a run is in its life. `parked` belongs to the worker: a run held at a turn boundary.
    `waiting` is a run of a conversation that has an active run (see jobs/conversations.py)."""

    RUNNING = "running"
    WAITING = "waiting"  # its conversation has an active run; it starts when that one ends
    SUSPENDED = "suspended"
    PARKED = "parked"
    STOPPED = "stopped"
