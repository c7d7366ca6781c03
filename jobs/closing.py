"""The closing message to the user, built from the state by template, with no model call.

It reads the plan's statuses, so even a run stopped by a budget tells the user exactly what
was done and what was not: "the refund was issued; the confirmation email was not sent". A
write the state does not show as done (its turn died before committing, and the run was then
cancelled or ended) is asked of its system of record: what the world recorded is what the user
is told.
"""

from __future__ import annotations

from typing import Any

import msgspec

from turnstile.jobs.calls import plan_step_key
from turnstile.jobs.job import Job
from turnstile.jobs.outcomes import Outcome, Resource
from turnstile.jobs.state import RunState
from turnstile.jobs.tools import ToolContext

_RESOURCE_WORDS = {
    Resource.STEPS: "step",
    Resource.TOOL_CALLS: "tool call",
    Resource.DEADLINE: "time",
    Resource.TOKENS: "token",
    Resource.COST: "cost",
}

_OPENINGS = {
    Outcome.COMPLETED: "Your request is complete.",
    Outcome.LOOP_DETECTED: "We stopped because the assistant was going round in circles; "
    "a person will pick this up.",
    Outcome.NEEDS_APPROVAL: "Part of your request needs a person's approval; "
    "we will continue once it is decided.",
    Outcome.APPROVAL_DENIED: "A reviewer declined part of your request.",
    Outcome.ESCALATED: "Your request has been handed to a person.",
    Outcome.GUARDRAIL_STOP: "We stopped because a safety check refused an action.",
    Outcome.TOOL_FAILURE: "We stopped because a system we rely on kept failing; "
    "a person will follow up.",
    Outcome.UNKNOWN_OUTCOME: "We could not confirm whether our last action took effect; "
    "a person will check before anything is retried.",
    Outcome.CANCELLED: "Your request was cancelled.",
    Outcome.SUPERSEDED: "We stopped working on this request to take up your newer message.",
    Outcome.ERROR: "Something went wrong on our side; a person will look at it.",
    Outcome.DIVERGED: "This evaluation run stopped where it left its recording.",
}


def _opening(state: RunState) -> str:
    if state.outcome is Outcome.BUDGET_EXHAUSTED:
        known = {r.value: r for r in Resource}
        resource = known.get(state.detail or "")
        words = _RESOURCE_WORDS[resource] if resource else None
        limit = f"its {words} limit" if words else "the account's limit"
        return f"We stopped before finishing: this request reached {limit}."
    if state.outcome is None:
        return "Your request is in progress."
    return _OPENINGS[state.outcome]


def recorded_steps(state: RunState, job: Job) -> frozenset[str]:
    """The plan steps not done in the state whose write its system of record shows as done,
    under the step's idempotency key: a turn that died after the write and before its commit
    leaves the world ahead of the state. Read-only; only tools that can tell are asked."""
    found = set()
    for step in state.plan:
        tool = job.tools.get(step.tool)
        if step.status == "done" or tool is None or tool.recorded is None:
            continue
        key = plan_step_key(state.run_id, step.id)
        ctx = ToolContext(state.run_id, state.tenant, state.user_id, state.params, {}, key, 0.0)
        if tool.recorded(ctx):
            found.add(step.id)
    return frozenset(found)


def _progress(state: RunState, job: Job, recorded: frozenset[str]) -> list[str]:
    parts = []
    for step in state.plan:
        tool = job.tools.get(step.tool)
        if tool is None or not tool.done_text:
            continue
        if step.status == "done" or step.id in recorded:
            parts.append(tool.done_text)
        elif state.unconfirmed in (step.id, step.tool) and state.outcome is Outcome.UNKNOWN_OUTCOME:
            parts.append(f"we could not confirm whether {tool.done_text}")
        else:
            parts.append(tool.open_text)
    return parts


def closing_message(state: RunState, job: Job, *, recorded: frozenset[str] = frozenset()) -> str:
    """The message for the run's user; `recorded` names plan steps that `recorded_steps` found
    done in the world though not in the state."""
    parts = _progress(state, job, recorded)
    if not parts:
        return _opening(state)
    detail = "; ".join(parts)
    return f"{_opening(state)} So far: {detail}."


def closing_without_state(outcome: Outcome) -> str:
    """The message for a run whose state cannot be read: the outcome's opening alone."""
    return _OPENINGS.get(outcome, _OPENINGS[Outcome.ERROR])


def finished_event(
    state: RunState | None, job: Job | None, *, reason: str, at: str,
    recorded: frozenset[str] = frozenset(),
) -> dict[str, Any]:  # fmt: skip
    """A stopped run's one `finished` event, with its closing message: from the state and the
    job (`recorded` as for `closing_message`); the outcome's opening alone for a job this
    process does not know (`job` None); for a state that cannot be read (`state` None), an
    `error` with `reason` and nothing else."""
    if state is None:
        return {"type": "finished", "outcome": Outcome.ERROR.value, "detail": None,
                "reason": reason, "answer": None, "usage": None, "at": at,
                "message": closing_without_state(Outcome.ERROR)}  # fmt: skip
    outcome = state.outcome or Outcome.ERROR
    if job is None:
        message = closing_without_state(outcome)
    else:
        message = closing_message(state, job, recorded=recorded)
    return {
        "type": "finished", "outcome": outcome.value, "detail": state.detail,
        "reason": reason, "answer": state.answer, "message": message,
        "usage": msgspec.to_builtins(state.usage), "at": at,
    }  # fmt: skip
