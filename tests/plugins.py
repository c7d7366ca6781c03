"""Job plugins for the registry tests, named through TURNSTILE_JOBS: one good, the others each
broken in one way."""

from __future__ import annotations

import time
from collections.abc import Mapping
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


def bad_provider() -> Job:
    """A job whose default model names a provider there is not (a slip of `openai`)."""
    return Job(name="toy_bad_provider", tools={}, model="opneai:gpt-4.1-mini")


def typo_fallback() -> Job:
    """A job whose fallback model is a typing slip from a known model."""
    return Job(name="toy_typo_fallback", tools={}, model="openai:gpt-4.1-mini",
               fallback_model="openai:gpt-4.1-mnii")  # fmt: skip


@tool
def stock_dates(ctx: ToolContext, sku: str) -> Any:
    """When the item is back in stock: a set of dates, which is no JSON value."""
    return {"2025-06-01", "2025-06-08"}


def _ask_stock_then_answer(view: Any, i: int) -> dict[str, Any]:
    if i == 1:
        return {"type": "tool", "name": "stock_dates", "args": {"sku": "A-1"}}
    return _final(view, i)


def bad_value(client: object = None) -> Job:
    """A job whose one tool returns a set: its call is a `bad_result`, and the run goes on."""
    return Job(name="toy_bad_value", tools={"stock_dates": stock_dates},
               model=lambda params: Scripted(_ask_stock_then_answer, 0.1))  # fmt: skip


def same_name() -> Job:
    return Job(name="toy_good", tools={}, model=good().model)


CLIENTS: list[object] = []


def records_client(client: object) -> Job:
    """A factory that takes the worker's client: it is handed one (or None in process)."""
    CLIENTS.append(client)
    return Job(name="toy_client", tools={}, model=good().model)


def one_turn(client: object = None) -> Job:
    """A run of one turn whose model really takes `turn_s` seconds (default 0.1) and answers:
    one step per run, for the scheduling tests (priorities, aging)."""

    def model(params: Mapping[str, Any]) -> Scripted:
        turn_s = float(params.get("turn_s", 0.1))

        def reply(view: Any, i: int) -> dict[str, Any]:
            time.sleep(turn_s)
            return _final(view, i)

        return Scripted(reply, turn_s)

    return Job(
        name="toy_one_turn",
        tools={"echo": echo},
        model=model,
        params_schema={
            "type": "object",
            "properties": {"turn_s": {"type": "number", "minimum": 0, "maximum": 5}},
            "additionalProperties": False,
        },
    )
