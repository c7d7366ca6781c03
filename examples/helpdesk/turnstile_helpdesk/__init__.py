"""A help-desk agent on a real model, written against Turnstile's public API only.

The job names its model as a string, so it runs on OpenAI (`openai:gpt-4.1-mini`) unless
HELPDESK_MODEL names another when the worker starts (`anthropic:claude-sonnet-4-6`, or
`ollama:llama3.1:8b` for a named endpoint), and a run's `model` parameter overrides both.
HELPDESK_FALLBACK_MODEL names a second model, asked when the first keeps failing (rate
limits, 5xx) past its retries.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from turnstile import Budget, Job, ToolContext, tool

NAME = "helpdesk"
DEFAULT_MODEL = "openai:gpt-4.1-mini"
ORDERS = {
    "A-100": {"order_status": "shipped", "carrier": "DHL", "eta_days": 2},
    "A-200": {"order_status": "delayed", "carrier": "UPS", "eta_days": 6},
}
FAQ = {
    "delivery": "Orders ship within a day; tracking comes by email.",
    "returns": "Returns are free within 30 days from the returns page.",
}
PARAMS_SCHEMA = {
    "type": "object",
    "properties": {"order_id": {"type": "string", "minLength": 1, "maxLength": 32}},
    "required": ["order_id"],
    "additionalProperties": False,
}


class Notes:
    """The replies posted, per run: posting the same reply twice is one reply."""

    def __init__(self) -> None:
        self.posted: dict[tuple[str, str], str] = {}
        self.lock = threading.Lock()

    def post(self, run_id: str, key: str, body: str) -> str:
        with self.lock:
            return self.posted.setdefault((run_id, key), body)


def tools(notes: Notes) -> dict[str, Any]:
    @tool(facts=("order_status", "carrier", "eta_days"))
    def get_order(ctx: ToolContext, order_id: str) -> dict[str, Any]:
        """Look an order up: its status, carrier and the days until it arrives."""
        found = ORDERS.get(order_id)
        if found is None:
            return {"status": "error", "code": "not_found", "detail": f"no order {order_id}"}
        return {"status": "ok", **found}

    @tool(facts=("faq_answer",))
    def search_faq(ctx: ToolContext, topic: str) -> dict[str, Any]:
        """Find the FAQ answer on a topic: delivery or returns."""
        answer = FAQ.get(topic.lower(), "No FAQ entry; a person will follow up.")
        return {"status": "ok", "faq_answer": answer}

    @tool(mutates=True, facts=("replied",), key_args=("order_id",),
          done_text="we replied to the customer", open_text="no reply was posted")  # fmt: skip
    def post_reply(ctx: ToolContext, order_id: str, body: str) -> dict[str, Any]:
        """Post a reply to the customer about their order. A posted reply can be edited."""
        notes.post(ctx.run_id, ctx.key, body)
        return {"status": "ok", "replied": True}

    return {t.name: t for t in (get_order, search_faq, post_reply)}


def helpdesk(client: Any = None) -> Job:
    """The entry point's factory: the model is chosen where the worker starts."""
    return Job(
        name=NAME,
        description="Answer a customer's question about an order, on a real model.",
        tools=tools(Notes()),
        model=os.environ.get("HELPDESK_MODEL") or DEFAULT_MODEL,
        fallback_model=os.environ.get("HELPDESK_FALLBACK_MODEL") or None,
        budget=Budget(max_steps=8, max_tool_calls=6, max_tokens=40_000),
        params_schema=PARAMS_SCHEMA,
    )


__all__ = ["DEFAULT_MODEL", "NAME", "helpdesk"]
