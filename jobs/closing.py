"""The closing message to the user, built from the state by template, with no model call.

It reads the plan's statuses, so even a run stopped by a budget tells the user exactly what
was done and what was not: "the refund was issued; the confirmation email was not sent".
"""

from __future__ import annotations

from jobs.job import Job
from jobs.outcomes import Outcome, Resource
from jobs.state import RunState

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
    Outcome.ERROR: "Something went wrong on our side; a person will look at it.",
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


def _progress(state: RunState, job: Job) -> list[str]:
    parts = []
    for step in state.plan:
        tool = job.tools.get(step.tool)
        if tool is None or not tool.done_text:
            continue
        if step.status == "done":
            parts.append(tool.done_text)
        elif state.unconfirmed in (step.id, step.tool) and state.outcome is Outcome.UNKNOWN_OUTCOME:
            parts.append(f"we could not confirm whether {tool.done_text}")
        else:
            parts.append(tool.open_text)
    return parts


def closing_message(state: RunState, job: Job) -> str:
    parts = _progress(state, job)
    if not parts:
        return _opening(state)
    detail = "; ".join(parts)
    return f"{_opening(state)} So far: {detail}."
