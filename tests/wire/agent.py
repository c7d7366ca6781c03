"""The wire server's agent: a provider's replies for ANY job, made from the request itself.

A request carries the job's tools as function definitions and the run's view as its user
message; the previous turn's calls, if any, follow it. From these alone (no state kept between
requests, so retries, many runs and many workers are all served alike) the agent:

- proposes a plan when the view has none: one step per tool to call, `s1` first and every
  other step depending on `s1` (so the first tool should be a read);
- otherwise calls the tool after the one the previous turn called, in declared order (or the
  script's `calls` order), with the script's arguments for it, else arguments made up from its
  schema, and the plan step it carries out (`off_plan` tools carry none and are left out of the
  plan: a tool that fails would otherwise keep its step open and the final answer refused);
- answers `final_answer` (`completed`) when every tool has been called.

Every reply reports USAGE tokens, in the format's own fields.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

PLAN, FINAL, PLAN_STEP = "propose_plan", "final_answer", "plan_step"
OPENAI_PATH, ANTHROPIC_PATH = "/v1/chat/completions", "/v1/messages"
USAGE = {"input": 500, "output": 40}  # each reply's tokens, whatever the format


def made_up(schema: Mapping[str, Any]) -> Any:
    """A value the schema accepts, for the common schemas `@tool` derives."""
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    union = schema.get("anyOf") or schema.get("oneOf")
    if union:
        return made_up(union[0])
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    properties, required = schema.get("properties") or {}, schema.get("required") or []
    by_kind: dict[Any, Any] = {
        "string": lambda: "x" * max(1, int(schema.get("minLength", 1))),
        "integer": lambda: max(1, int(schema.get("minimum", 1))),
        "number": lambda: max(1, int(schema.get("minimum", 1))),
        "boolean": lambda: True,
        "array": lambda: [],
        "object": lambda: {k: made_up(properties.get(k) or {}) for k in required},
    }
    return by_kind[kind]() if kind in by_kind else None


def declared(path: str, body: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """The job's tools in the request, name -> argument schema, in declared order."""
    out: dict[str, Mapping[str, Any]] = {}
    for raw in body.get("tools") or []:
        if path == OPENAI_PATH:
            name, schema = raw["function"]["name"], raw["function"].get("parameters") or {}
        else:
            name, schema = raw["name"], raw.get("input_schema") or {}
        if name not in (PLAN, FINAL):
            out[name] = schema
    return out


def view_of(path: str, body: Mapping[str, Any]) -> dict[str, Any]:
    messages = [m for m in body["messages"] if m["role"] != "system"]
    view: dict[str, Any] = json.loads(messages[0]["content"])
    return view


def previous_calls(path: str, body: Mapping[str, Any]) -> list[str]:
    """The names of the calls the previous turn made, from the exchange the request carries."""
    for message in body["messages"]:
        if message["role"] != "assistant":
            continue
        if path == OPENAI_PATH:
            return [c["function"]["name"] for c in message.get("tool_calls") or []]
        return [b["name"] for b in message.get("content") or [] if b.get("type") == "tool_use"]
    return []


@dataclass
class Agent:
    args: dict[str, dict[str, Any]] = field(default_factory=dict)
    calls: list[str] | None = None  # the tools to call, in order; default: all, as declared
    off_plan: list[str] = field(default_factory=list)
    answer: str = "done"

    @classmethod
    def of(cls, script: Mapping[str, Any]) -> Agent:
        return cls(
            args=dict(script.get("args") or {}), calls=script.get("calls"),
            off_plan=list(script.get("off_plan") or []), answer=script.get("answer", "done"),
        )  # fmt: skip

    def decide(self, path: str, body: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
        """The one function call this turn's reply makes."""
        tools = declared(path, body)
        order = [t for t in (self.calls or list(tools)) if t in tools]
        planned = [t for t in order if t not in self.off_plan]
        if not view_of(path, body)["plan"]:
            steps = [
                {"id": f"s{i + 1}", "tool": t, "depends_on": ["s1"] if i else []}
                for i, t in enumerate(planned)
            ]
            return PLAN, {"steps": steps}
        before = previous_calls(path, body)
        index = order.index(before[-1]) + 1 if before and before[-1] in order else 0
        if index >= len(order):
            return FINAL, {"outcome": "completed", "text": self.answer}
        name = order[index]
        args = dict(self.args.get(name) or made_up({**tools[name], "type": "object"}))
        if name in planned:
            args[PLAN_STEP] = f"s{planned.index(name) + 1}"
        return name, args

    def reply(self, path: str, body: Mapping[str, Any], number: int) -> dict[str, Any]:
        """The reply's body in the request's wire format."""
        name, args = self.decide(path, body)
        model = str(body.get("model"))
        if path == OPENAI_PATH:
            return openai_reply(model, name, args, number)
        return anthropic_reply(model, name, args, number)


def openai_reply(model: str, name: str, args: Mapping[str, Any], number: int) -> dict[str, Any]:
    call = {"id": f"call_agent_{number}", "type": "function",
            "function": {"name": name, "arguments": json.dumps(args)}}  # fmt: skip
    return {
        "id": f"chatcmpl-agent-{number}", "object": "chat.completion", "created": 0,
        "model": model,
        "choices": [{"index": 0, "finish_reason": "tool_calls",
                     "message": {"role": "assistant", "content": None, "tool_calls": [call]}}],
        "usage": {"prompt_tokens": USAGE["input"], "completion_tokens": USAGE["output"],
                  "total_tokens": USAGE["input"] + USAGE["output"],
                  "prompt_tokens_details": {"cached_tokens": 0},
                  "completion_tokens_details": {"reasoning_tokens": 0}},
    }  # fmt: skip


def anthropic_reply(model: str, name: str, args: Mapping[str, Any], number: int) -> dict[str, Any]:
    return {
        "id": f"msg_agent_{number}", "type": "message", "role": "assistant", "model": model,
        "content": [{"type": "tool_use", "id": f"toolu_agent_{number}", "name": name,
                     "input": dict(args)}],
        "stop_reason": "tool_use", "stop_sequence": None,
        "usage": {"input_tokens": USAGE["input"], "output_tokens": USAGE["output"],
                  "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0},
    }  # fmt: skip
