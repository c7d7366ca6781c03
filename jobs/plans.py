"""Static checks on a proposed plan, before any of its steps runs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from turnstile.jobs.state import PlanStep
from turnstile.jobs.tools import Tool


def _step_problems(index: int, raw: Any) -> tuple[str, str, list[str]] | str:
    if not isinstance(raw, Mapping):
        return f"step {index}: not an object"
    sid, tool, deps = raw.get("id"), raw.get("tool"), raw.get("depends_on", [])
    if not isinstance(sid, str) or not sid:
        return f"step {index}: id must be a non-empty string"
    if not isinstance(tool, str):
        return f"{sid}: tool must be a string"
    if not isinstance(deps, list) or not all(isinstance(d, str) for d in deps):
        return f"{sid}: depends_on must be a list of step ids"
    return sid, tool, deps


def validate_plan(steps: Any, *, tools: Mapping[str, Tool], max_steps: int) -> list[str]:
    """Problems with a plan, in words the model can act on; empty means acceptable.

    Every tool must exist, every dependency must name an earlier step, ids must be unique, the
    plan must fit the budget's step limit, and a step that writes must depend on something:
    nothing is changed before what it changes has been read.
    """
    if not isinstance(steps, list) or not steps:
        return ["a plan must be a non-empty list of steps"]
    problems: list[str] = []
    if len(steps) > max_steps:
        problems.append(f"too many steps: {len(steps)}, at most {max_steps}")
    earlier: set[str] = set()
    for index, raw in enumerate(steps, 1):
        parsed = _step_problems(index, raw)
        if isinstance(parsed, str):
            problems.append(parsed)
            continue
        sid, tool, deps = parsed
        if sid in earlier:
            problems.append(f"{sid}: duplicate id")
        if tool not in tools:
            problems.append(f"{sid}: no tool named {tool!r}")
        problems.extend(f"{sid}: {d!r} is not an earlier step" for d in deps if d not in earlier)
        if tool in tools and tools[tool].mutates and not deps:
            problems.append(f"{sid}: a step that writes needs a prerequisite")
        earlier.add(sid)
    return problems


def accept_plan(steps: list[Any]) -> list[PlanStep]:
    """A validated plan as state: every step pending."""
    return [
        PlanStep(id=s["id"], tool=s["tool"], depends_on=list(s.get("depends_on", [])))
        for s in steps
    ]


def open_steps(plan: list[PlanStep]) -> list[str]:
    return [s.id for s in plan if s.status == "pending"]
