"""The support job: tools, policy, guardrail and model, put together."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from jobs.errors import ParamsError
from jobs.job import GRANT_RULE, Guard, Job, Permit, Severity, Verdict
from jobs.state import Call, RunState
from jobs.support.models import check_model_params, make_model
from jobs.support.shop import ShopBackend
from jobs.support.tools import DEFAULT_LATENCY_S, DRILL_PARAMS, support_tools
from jobs.tools import Tool

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


def check_params(params: Mapping[str, Any]) -> None:
    check_model_params(params)
    latencies = params.get("tool_latency_s", {})
    if not isinstance(latencies, Mapping) or not all(
        name in DEFAULT_LATENCY_S and isinstance(v, int | float) and 0 <= v <= 600
        for name, v in latencies.items()
    ):
        raise ParamsError("tool_latency_s must map support tool names to seconds (0 to 600)")
    sleeps = params.get("sleep_s", {})
    if not isinstance(sleeps, Mapping) or not all(
        name in DEFAULT_LATENCY_S and isinstance(v, int | float) and 0 <= v <= 600
        for name, v in sleeps.items()
    ):
        raise ParamsError("sleep_s must map support tool names to seconds (0 to 600)")
    if params.get("die_in") not in (None, *DEFAULT_LATENCY_S):
        raise ParamsError("die_in must name a support tool")
    shop = params.get("shop")
    if shop is not None and (not isinstance(shop, str) or not 0 < len(shop) <= 64):
        raise ParamsError("shop must be a name of 1 to 64 characters")


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
        check_params(params)
        if not drills:
            refuse_drills(params)

    return Job(
        name=NAME,
        tools=support_tools(shop, drills=drills),
        model=functools.partial(make_model, drills=drills),
        policy=policy,
        guardrail=guardrail,
        check_params=checked,
    )
