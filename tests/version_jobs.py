"""Two versions of one job, `deploy`, for the rolling-deploy tests (named through
TURNSTILE_JOBS): v1 says lines with `say`; v2 renamed the tool `speak` and added a `tone`
parameter. Each tool's result names the code that ran it (`code`), so a test checks, turn by
turn, which version ran it. `deploy_v2_migrating` upgrades a v1 run's state (its params get
the new `tone`); a run whose goal asks for it makes that migration raise. Written against the
public API only."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from turnstile import Budget, Job, ToolContext, tool
from turnstile.jobs.model import Scripted
from turnstile.jobs.state import RunState

BUDGET = Budget(max_steps=40, max_tool_calls=40, max_tokens=100_000, deadline_ms=120_000)
BREAK_MIGRATION = "break the migration"


def _line(code: str, ctx: ToolContext, text: str) -> dict[str, Any]:
    time.sleep(float(ctx.params.get("sleep_s", 0)))
    return {"status": "ok", "said": text, "code": code}


@tool(facts=("said",), fact_scope="line")
def say(ctx: ToolContext, line: str, text: str) -> dict[str, Any]:
    """Say one line (v1)."""
    return _line("v1", ctx, text)


@tool(facts=("said",), fact_scope="line")
def speak(ctx: ToolContext, line: str, text: str) -> dict[str, Any]:
    """Say one line (v2: the tool renamed)."""
    return _line("v2", ctx, text)


def _model(tool_name: str) -> Any:
    def factory(params: Mapping[str, Any]) -> Any:
        turns = int(params.get("turns", 4))

        def reply(view: Any, step: int) -> dict[str, Any]:
            said = len(view.get("facts") or {})
            if said >= turns:
                return {"type": "final", "outcome": "completed", "text": f"said {said} lines"}
            return {"type": "tool", "name": tool_name,
                    "args": {"line": f"l{said}", "text": f"line {said}"}}  # fmt: skip

        return Scripted(reply, 0.01)

    return factory


def _params(*extra: str) -> dict[str, Any]:
    properties: dict[str, Any] = {
        "turns": {"type": "integer", "minimum": 1, "maximum": 30},
        "sleep_s": {"type": "number", "minimum": 0, "maximum": 5},
        "migrate_sleep_s": {"type": "number", "minimum": 0, "maximum": 30},
    }
    if "tone" in extra:
        properties["tone"] = {"type": "string", "enum": ["plain", "warm"]}
    return {"type": "object", "properties": properties, "additionalProperties": False}


def deploy_v1() -> Job:
    return Job(name="deploy", tools={"say": say}, model=_model("say"), budget=BUDGET,
               params_schema=_params(), version="v1")  # fmt: skip


def deploy_v2() -> Job:
    return Job(name="deploy", tools={"speak": speak}, model=_model("speak"), budget=BUDGET,
               params_schema=_params("tone"), version="v2")  # fmt: skip


def from_v1(state: RunState) -> None:
    """v1 -> v2: the new parameter gets its default. Sleeps `migrate_sleep_s` first (a kill
    lands in it); a run whose goal asks for it raises."""
    time.sleep(float(state.params.get("migrate_sleep_s", 0)))
    if state.goal == BREAK_MIGRATION:
        raise ValueError("cannot migrate this run: its goal says so")
    state.params["tone"] = "plain"


def deploy_v2_migrating() -> Job:
    return Job(name="deploy", tools={"speak": speak}, model=_model("speak"), budget=BUDGET,
               params_schema=_params("tone"), version="v2",
               migrate={"v1": from_v1})  # fmt: skip


def deploy_v1_other() -> Job:
    """Another definition claiming version v1: a worker with it is refused as it starts."""
    return Job(name="deploy", tools={"speak": speak}, model=_model("speak"), budget=BUDGET,
               params_schema=_params(), version="v1")  # fmt: skip


V1 = "tests.version_jobs:deploy_v1"
V2 = "tests.version_jobs:deploy_v2"
V2_MIGRATING = "tests.version_jobs:deploy_v2_migrating"
V1_OTHER = "tests.version_jobs:deploy_v1_other"
