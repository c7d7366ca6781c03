"""A job: the tools, policy, guardrail, view and model factory that one kind of run uses."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property
from typing import Any

from jobs.budget import Budget
from jobs.model import Model
from jobs.state import Call, RunState
from jobs.tools import Tool


class Permit(StrEnum):
    ALLOW = "allow"
    DENY = "deny"
    ASK = "ask"


@dataclass(frozen=True)
class Verdict:
    decision: Permit
    reason: str = ""
    rule: str = "default"


GRANT_RULE = "job.grant"  # a job's explicit allowance: the only thing that lets an
#                           irreversible write run without asking a person


class Severity(StrEnum):
    BLOCK = "block"  # refuse this call, tell the model why
    HALT = "halt"  # stop the run: guardrail_stop


@dataclass(frozen=True)
class Guard:
    severity: Severity
    detail: str


PolicyFn = Callable[[Call, Tool, RunState], Verdict]
GuardFn = Callable[[Call, RunState], Guard | None]


def allow_all(call: Call, tool: Tool, state: RunState) -> Verdict:
    return Verdict(Permit.ALLOW)


def no_guard(call: Call, state: RunState) -> Guard | None:
    return None


def tighten(verdict: Verdict, tool: Tool) -> Verdict:
    """A tool's risk may only tighten a verdict: an irreversible write asks a person unless the
    job granted it explicitly."""
    if (
        verdict.decision is Permit.ALLOW
        and tool.mutates
        and not tool.reversible
        and verdict.rule != GRANT_RULE
    ):
        return Verdict(Permit.ASK, "irreversible action", "tool.irreversible")
    return verdict


def render_view(state: RunState) -> str:
    """What the model is shown: goal, plan with statuses, facts, last result and the budget it
    has left. Never the transcript. Recalled notes appear, labelled, only when there are any."""
    view: dict[str, Any] = {
        "goal": state.goal,
        "plan": [
            {"id": s.id, "tool": s.tool, "depends_on": s.depends_on, "status": s.status}
            for s in state.plan
        ],
        "facts": state.facts,
        "last_result": state.last_result,
        "remaining": {
            "steps": state.budget.max_steps - state.usage.steps,
            "tool_calls": state.budget.max_tool_calls - state.usage.tool_calls,
            "tokens": state.budget.max_tokens - state.usage.tokens,
        },
    }
    if state.memory:
        view["remembered_notes"] = state.memory
    return json.dumps(view, sort_keys=True)


def _no_params_check(params: Mapping[str, Any]) -> None:
    return None


@dataclass(frozen=True, eq=False)
class Job:
    name: str
    tools: Mapping[str, Tool]
    model: Callable[[Mapping[str, Any]], Model]  # the run's model, built from its params
    budget: Budget = field(default_factory=Budget)
    render: Callable[[RunState], str] = render_view
    policy: PolicyFn = allow_all
    guardrail: GuardFn = no_guard
    deny_as_observation: bool = False  # a denial is shown to the model instead of ending
    check_params: Callable[[Mapping[str, Any]], None] = _no_params_check

    @cached_property
    def tool_cost_bound_microusd(self) -> int:
        """The most one call of this job can cost: what a per-turn allowance reserves."""
        return max((t.cost_bound_microusd for t in self.tools.values()), default=0)
