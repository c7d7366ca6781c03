"""A job for the budget-extension tests, named through TURNSTILE_JOBS: each turn says one more
line through a read tool until it has said `turns` of them, then answers. Its model is a
scripted stand-in whose tokens the kernel estimates from the view, so every turn spends
tokens, and running out of them suspends the run `needs_budget` (tokens are extendable).
Written against the public API only."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from turnstile import Budget, Job, ToolContext, tool
from turnstile.jobs.model import Scripted

TURNS = 8  # lines a run says before it answers, unless its params say otherwise
BUDGET = Budget(
    max_steps=40, max_tool_calls=40, max_tokens=300, max_output_tokens=60, deadline_ms=60_000
)


@tool(facts=("said",), fact_scope="line")
def say(ctx: ToolContext, line: str, text: str) -> dict[str, Any]:
    """Say one line (taking `sleep_s` of the run's params to say it: a turn a kill can land in)."""
    time.sleep(float(ctx.params.get("sleep_s", 0)))
    return {"status": "ok", "said": text}


def _reply(turns: int) -> Any:
    def reply(view: Any, step: int) -> dict[str, Any]:
        said = len(view.get("facts") or {})
        if said >= turns:
            return {"type": "final", "outcome": "completed", "text": f"said {said} lines"}
        return {"type": "tool", "name": "say",
                "args": {"line": f"l{said}", "text": f"line {said} of {turns}"}}  # fmt: skip

    return reply


def _model(params: Mapping[str, Any]) -> Any:
    return Scripted(_reply(int(params.get("turns", TURNS))), float(params.get("latency_s", 0.05)))


def spender(client: object = None) -> Job:
    return Job(
        name="spender",
        description="Say a few lines, one a turn, then answer.",
        tools={"say": say},
        model=_model,
        budget=BUDGET,
        extendable=("tokens",),
        params_schema={
            "type": "object",
            "properties": {
                "turns": {"type": "integer", "minimum": 1, "maximum": 30},
                "latency_s": {"type": "number", "minimum": 0, "maximum": 5},
                "sleep_s": {"type": "number", "minimum": 0, "maximum": 5},
            },
            "additionalProperties": False,
        },
    )


SPEC = "tests.budget_jobs:spender"
