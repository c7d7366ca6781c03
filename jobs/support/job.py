"""The support job: tools, policy, guardrail and model, put together."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from turnstile.jobs.conversations import ConversationPolicy
from turnstile.jobs.errors import ParamsError
from turnstile.jobs.job import GRANT_RULE, Guard, Job, Permit, Severity, Verdict
from turnstile.jobs.state import Call, RunState
from turnstile.jobs.support.models import MODELS, check_model_params, make_model
from turnstile.jobs.support.shop import ShopBackend
from turnstile.jobs.support.tools import (
    DEFAULT_LATENCY_S,
    DRILL_PARAMS,
    REFUND_DIMENSION,
    support_tools,
)
from turnstile.jobs.tools import Tool

NAME = "support"
_OVERRIDE_WORDS = ("ignore", "override", "bypass")


def policy(call: Call, tool: Tool, state: RunState) -> Verdict:
    """Refunds and status emails are granted: the shop itself refuses a refund above what
    is refundable and holds one above the automatic limit for a person."""
    if tool.mutates:
        return Verdict(Permit.ALLOW, "the shop enforces refund limits and approvals", GRANT_RULE)
    return Verdict(Permit.ALLOW)


def guardrail(call: Call, state: RunState) -> Guard | None:
    """A refund whose stated reason tries to talk its way past the rules stops the run."""
    reason = str(call.args.get("reason", "")).lower() if call.name == "issue_refund" else ""
    if any(word in reason for word in _OVERRIDE_WORDS):
        return Guard(Severity.HALT, "a refund reason tried to override the shop's rules")
    return None


def _seconds_by_tool(maximum: int) -> dict[str, Any]:
    return {
        "type": "object",
        "propertyNames": {"enum": sorted(DEFAULT_LATENCY_S)},
        "additionalProperties": {"type": "number", "minimum": 0, "maximum": maximum},
    }


# The run's params: one entry per key, so a new one is a line here (and its use in models.py
# or tools.py). Unknown keys are refused.
PARAMS_PROPERTIES: dict[str, dict[str, Any]] = {
    "model": {"type": "string", "minLength": 1, "maxLength": 160,
              "description": "a scripted model (" + ", ".join(MODELS) + ") or provider:model"},
    "model_latency_s": {"type": "number", "minimum": 0, "maximum": 600},
    "model_sleep_s": {"type": "number", "minimum": 0, "maximum": 3600,
                      "description": "drill: the model really sleeps, ignoring its timeout"},
    "order": {"type": "string", "minLength": 1, "maxLength": 64},
    "amount_cents": {"type": "integer", "minimum": 1, "maximum": 10_000_000},
    "tool_latency_s": _seconds_by_tool(600),
    "sleep_s": {**_seconds_by_tool(600), "description": "drill: a tool really sleeps"},
    "die_in": {"enum": sorted(DEFAULT_LATENCY_S),
               "description": "drill: the call of this tool kills its worker process"},
    "shop": {"type": "string", "minLength": 1, "maxLength": 64,
             "description": "a shop shared by the runs of the tenant's that name it"},
}  # fmt: skip


def params_schema() -> dict[str, Any]:
    return {"type": "object", "properties": PARAMS_PROPERTIES, "additionalProperties": False}


def refuse_drills(params: Mapping[str, Any]) -> None:
    asked = [name for name in DRILL_PARAMS if name in params]
    if asked:
        raise ParamsError(
            f"{', '.join(asked)}: failure drills are off here "
            "(a test or staging system turns them on with TURNSTILE_ALLOW_DRILLS=1)"
        )


def support_job(shop: ShopBackend, *, drills: bool = False) -> Job:
    """The support job. Without `drills` a submission asking for a failure drill (`die_in`,
    `sleep_s`, `model_sleep_s`) is refused, and a run that carries one anyway runs without it."""

    def checked(params: Mapping[str, Any]) -> None:
        check_model_params(params)
        if not drills:
            refuse_drills(params)

    return Job(
        name=NAME,
        description="Refund a damaged item and confirm by email (the demo's support agent).",
        tools=support_tools(shop, drills=drills),
        model=functools.partial(make_model, drills=drills),
        check_params=checked,  # a provider's name, and drills only where they are on
        policy=policy,
        guardrail=guardrail,
        params_schema=params_schema(),
        dimensions=(REFUND_DIMENSION,),
        drill_params=DRILL_PARAMS,
        shared_params=("shop",),
        # A customer who writes again while the agent works adds to the same case.
        conversation_policy=ConversationPolicy.MERGE,
    )
