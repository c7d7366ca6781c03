"""Job plugins for the registry tests, named through TURNSTILE_JOBS: one good, the others each
broken in one way."""

from __future__ import annotations

from typing import Any

from turnstile.jobs.declare import tool
from turnstile.jobs.job import Job
from turnstile.jobs.model import Scripted
from turnstile.jobs.tools import Tool, ToolContext, ToolOutput


def _final(view: Any, i: int) -> dict[str, Any]:
    return {"type": "final", "outcome": "completed", "text": "nothing to do"}


@tool
def echo(ctx: ToolContext, text: str, times: int = 1) -> dict[str, Any]:
    """Say the text back."""
    return {"text": text * times}


def good(client: object = None) -> Job:
    return Job(
        name="toy_good",
        tools={"echo": echo},
        model=lambda params: Scripted(_final, 0.1),
        params_schema={
            "type": "object",
            "properties": {"level": {"type": "integer", "minimum": 1, "maximum": 3}},
            "additionalProperties": False,
        },
    )


def raises() -> Job:
    raise RuntimeError("no credentials for the toy service")


def not_a_job(client: object = None) -> dict[str, str]:
    return {"name": "toy"}


def bad_schema() -> Job:
    broken = Tool(
        name="lookup",
        fn=lambda ctx: ToolOutput({"status": "ok"}),
        schema={"type": "strng"},
    )
    return Job(name="toy_bad_schema", tools={"lookup": broken}, model=good().model)


def same_name() -> Job:
    return Job(name="toy_good", tools={}, model=good().model)


CLIENTS: list[object] = []


def records_client(client: object) -> Job:
    """A factory that takes the worker's client: it is handed one (or None in process)."""
    CLIENTS.append(client)
    return Job(name="toy_client", tools={}, model=good().model)
