"""Jobs from outside the project for the model tests, named through TURNSTILE_JOBS: a help-desk
job on a real provider model by default, and jobs whose model cannot be built in one way each.
Written against the public API only."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from turnstile import Budget, Job, ToolContext, tool

DESK_MODEL = "openai:gpt-4.1-mini"


@tool(facts=("state", "owner"))
def find_ticket(ctx: ToolContext, ticket: str) -> dict[str, Any]:
    """Read a help-desk ticket: its state and its owner."""
    ctx.progress(f"reading ticket {ticket}")  # seen live (docs/live.md), kept nowhere
    return {"status": "ok", "ticket": ticket, "state": "open", "owner": "ana"}


@tool
def ticket_history(ctx: ToolContext, ticket: str) -> dict[str, Any]:
    """Read a ticket's history."""
    raise RuntimeError("the history database is on fire")


@tool(mutates=True, facts=("closed",), key_args=("ticket",))
def close_ticket(ctx: ToolContext, ticket: str, note: str) -> dict[str, Any]:
    """Close a ticket with a note to the customer. Reopening undoes it."""
    return {"status": "ok", "closed": True}


DESK_TOOLS = {t.name: t for t in (find_ticket, ticket_history, close_ticket)}
BUDGET = Budget(max_steps=8, max_tool_calls=6, deadline_ms=60_000)


def desk(client: object = None) -> Job:
    """The help-desk job, on a real provider model unless the run names another."""
    return Job(
        name="desk",
        description="Look a ticket up and close it.",
        tools=DESK_TOOLS,
        model=DESK_MODEL,
        budget=BUDGET,
    )


def _raising_factory(params: Mapping[str, Any]) -> Any:
    raise RuntimeError("the model registry is on fire")


def raising_model(client: object = None) -> Job:
    return Job(name="raising_model", tools=DESK_TOOLS, model=_raising_factory, budget=BUDGET)


def _dict_factory(params: Mapping[str, Any]) -> Any:
    return {"next": "no"}


def not_a_model(client: object = None) -> Job:
    return Job(name="not_a_model", tools=DESK_TOOLS, model=_dict_factory, budget=BUDGET)


def broken_in_worker(client: object = None) -> Job:
    """Built where the run is submitted; its factory raises in a worker that sets the variable."""
    if os.environ.get("MODEL_JOBS_FAIL"):
        raise RuntimeError("no credentials for the desk service")
    return Job(name="broken_in_worker", tools=DESK_TOOLS, model=DESK_MODEL, budget=BUDGET)


SPEC = ",".join(
    f"tests.model_jobs:{name}" for name in ("desk", "raising_model", "not_a_model",
                                            "broken_in_worker")
)  # fmt: skip
