"""A ticket-triage agent, written against Turnstile's public API only.

The model is scripted (deterministic, like the support job's): plan, classify the ticket,
look up the knowledge base for its category, draft and send a reply, answer. Sending is an
irreversible write, so Turnstile holds it for a person's approval.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any, Literal, Protocol

from turnstile import Example, Job, Model, Scripted, ToolContext, ToolOutput, tool

NAME = "triage"
CATEGORIES = ("billing", "bug", "account", "other")
KEYWORDS = {
    "billing": ("charge", "charged", "invoice", "refund", "payment", "subscription"),
    "bug": ("crash", "error", "broken", "bug", "fails"),
    "account": ("password", "login", "log in", "account", "email address"),
}
KNOWLEDGE_BASE = {
    "billing": ("KB-101", "Duplicate charges are reversed within 5 business days."),
    "bug": ("KB-202", "Update to the latest version; if it still fails, send us the log."),
    "account": ("KB-303", "Reset your password from the sign-in page."),
    "other": ("KB-000", "A person from our team will get back to you."),
}
PARAMS_SCHEMA = {
    "type": "object",
    "properties": {
        "ticket_id": {"type": "string", "minLength": 1, "maxLength": 64},
        "customer_tier": {"enum": ["free", "pro", "enterprise"]},
        "model_latency_s": {"type": "number", "minimum": 0, "maximum": 60},
    },
    "required": ["ticket_id"],
    "additionalProperties": False,
}


class Outbox(Protocol):
    def send_once(self, run_id: str, key: str, body: str) -> tuple[bool, str]:
        """Send under an idempotency key; (already sent?, the body sent)."""
        ...


class MemoryOutbox:
    def __init__(self) -> None:
        self._sent: dict[tuple[str, str], str] = {}
        self._lock = threading.Lock()

    def send_once(self, run_id: str, key: str, body: str) -> tuple[bool, str]:
        with self._lock:
            sent = (run_id, key) in self._sent
            return sent, self._sent.setdefault((run_id, key), body)


class RedisOutbox:
    """Sent replies in the worker's Redis, one hash per run: the same key is sent once."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def send_once(self, run_id: str, key: str, body: str) -> tuple[bool, str]:
        name = f"triage:{{{run_id}}}:sent"
        created = self.client.hsetnx(name, key, body)
        return not created, str(self.client.hget(name, key))


def classify(ticket: str) -> str:
    text = ticket.lower()
    return next((c for c, words in KEYWORDS.items() if any(w in text for w in words)), "other")


def tools(outbox: Outbox) -> dict[str, Any]:
    @tool(facts=("category", "priority"))
    def classify_ticket(ctx: ToolContext, ticket: str) -> dict[str, Any]:
        """Classify a support ticket into billing, bug, account or other, with a priority."""
        category = classify(ticket)
        tier = ctx.params.get("customer_tier", "free")
        priority = "high" if tier == "enterprise" or category == "bug" else "normal"
        return {"category": category, "priority": priority}

    @tool(facts=("article_id", "advice"))
    def search_kb(
        ctx: ToolContext, category: Literal["billing", "bug", "account", "other"]
    ) -> dict[str, Any]:
        """Find the knowledge-base article for a category."""
        article_id, advice = KNOWLEDGE_BASE[category]
        return {"article_id": article_id, "advice": advice}

    @tool(
        mutates=True,
        reversible=False,  # a sent email cannot be unsent: a person approves it first
        cost_bound_microusd=50,
        facts=("sent",),
        done_text="we replied to the ticket",
        open_text="the reply was not sent",
    )
    def send_reply(ctx: ToolContext, ticket_id: str, body: str) -> ToolOutput:
        """Send the drafted reply to the ticket's customer."""
        replayed, sent = outbox.send_once(ctx.run_id, ctx.key, body)
        return ToolOutput({"status": "ok", "sent": True, "replayed": replayed, "body": sent})

    return {t.name: t for t in (classify_ticket, search_kb, send_reply)}


def reply(view: Mapping[str, Any], ticket_id: str) -> dict[str, Any]:
    """The scripted model: one move per turn, chosen from the plan and the facts."""
    facts, plan = view["facts"], view["plan"]
    if not plan:
        return {
            "type": "plan",
            "steps": [
                {"id": "s1", "tool": "classify_ticket", "depends_on": []},
                {"id": "s2", "tool": "search_kb", "depends_on": ["s1"]},
                {"id": "s3", "tool": "send_reply", "depends_on": ["s2"]},
            ],
        }
    if "category" not in facts:
        args: dict[str, Any] = {"ticket": view["goal"]}
        return {"type": "tool", "name": "classify_ticket", "args": args, "plan_step": "s1"}
    if "article_id" not in facts:
        args = {"category": facts["category"]}
        return {"type": "tool", "name": "search_kb", "args": args, "plan_step": "s2"}
    if "sent" not in facts:
        body = (
            f"Hello, about your ticket {ticket_id}: {facts['advice']} (see {facts['article_id']})"
        )
        args = {"ticket_id": ticket_id, "body": body}
        return {"type": "tool", "name": "send_reply", "args": args, "plan_step": "s3"}
    return {"type": "final", "outcome": "completed", "text": f"Replied ({facts['category']})."}


def make_model(params: Mapping[str, Any]) -> Model:
    ticket_id = str(params["ticket_id"])
    return Scripted(
        lambda view, i: reply(view, ticket_id), float(params.get("model_latency_s", 0.5))
    )


def triage(client: Any = None) -> Job:
    """The entry point's factory: over the worker's Redis, or an outbox of its own."""
    outbox: Outbox = MemoryOutbox() if client is None else RedisOutbox(client)
    return Job(
        name=NAME,
        description="Triage a support ticket: classify, look up the knowledge base, reply.",
        tools=tools(outbox),
        model=make_model,
        params_schema=PARAMS_SCHEMA,
        examples=(
            Example(
                "double charge",
                "I was charged twice for my subscription",
                {"ticket_id": "T-1", "customer_tier": "pro"},
            ),
            Example(
                "crash on export", "The app crashes when I export a report", {"ticket_id": "T-2"}
            ),
        ),
    )


__all__ = ["CATEGORIES", "NAME", "classify", "triage"]
