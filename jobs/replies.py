"""The reply types a model may send, and their validation.

A reply is a proposal. Anything that is not one of these types, lacks a field, has a wrong
type or is larger than the output cap becomes an `invalid_reply` observation, never an error.
"""

from __future__ import annotations

import json
from typing import Any, Literal

import msgspec

from turnstile.jobs.budget import est_tokens
from turnstile.jobs.state import Call


class Final(msgspec.Struct, tag="final", tag_field="type"):
    outcome: Literal["completed", "cannot_complete", "escalate"]
    text: str


class Plan(msgspec.Struct, tag="plan", tag_field="type"):
    steps: Any  # checked step by step by the plan validator, which names each problem


class OneCall(msgspec.Struct, tag="tool", tag_field="type"):
    name: str
    args: dict[str, Any]
    plan_step: str | None = None


class Batch(msgspec.Struct, tag="tools", tag_field="type"):
    calls: list[Call]


Reply = Final | Plan | OneCall | Batch
MALFORMED = "malformed"  # a reply an adapter could not read: never valid, its problem is shown


def jsonable(raw: Any) -> Any:
    """The reply as plain JSON data; something that is not JSON becomes its repr, as text."""
    try:
        return json.loads(json.dumps(raw))
    except (TypeError, ValueError, RecursionError):
        return repr(raw)[:4000]


def reply_tokens(raw: Any) -> int:
    return est_tokens(json.dumps(raw))


def parse_reply(raw: Any, *, max_batch: int) -> Reply | str:
    """The typed reply, or a one-line reason why the raw reply is not a valid one. A provider
    adapter reports a reply it could not read (arguments that are not JSON, a cut reply) as
    `{"type": "malformed", "problem": ...}`, and the problem is the reason."""
    if isinstance(raw, dict) and raw.get("type") == MALFORMED:
        return str(raw.get("problem"))[:300]
    try:
        reply: Reply = msgspec.convert(raw, type=Reply)
    except msgspec.ValidationError as exc:
        return f"not a valid reply: {exc}"[:300]
    if isinstance(reply, Batch):
        if not reply.calls:
            return "a batch reply needs at least one call"
        if len(reply.calls) > max_batch:
            return f"a batch of {len(reply.calls)} calls is over the limit of {max_batch}"
    return reply


def calls_of(reply: OneCall | Batch) -> list[Call]:
    if isinstance(reply, OneCall):
        return [Call(name=reply.name, args=reply.args, plan_step=reply.plan_step)]
    return reply.calls
