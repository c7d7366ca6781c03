"""The turn contract on native tool calling, shared by every provider adapter.

Each request is stateless, so input tokens stay flat per turn: the system text, the rendered
view of the state as the user message, and at most the previous turn's exchange: its calls as
the assistant's tool calls and their observations (`last_result`) as the tool results, which
the APIs require to come in pairs. Ids are made up from the turn number, since the state keeps
no provider ids. The job's tools are the functions; proposing a plan and giving the final
answer are two more. The model's function calls come back as one kernel reply: a plan, one
call, a batch, or a final answer; what cannot be read becomes a `malformed` reply whose
problem the kernel shows the model.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jiter

from turnstile.jobs.model import ModelRequest, ToolSpec
from turnstile.jobs.replies import MALFORMED

PLAN = "propose_plan"
FINAL = "final_answer"
PLAN_STEP = "plan_step"

SYSTEM = (
    "You carry out a task one turn at a time by calling functions. Each turn you are shown the"
    " current state as JSON: the goal, the plan with each step's status, the facts learned so"
    " far, the last result and the budget left. Nothing else is remembered between turns."
    f" First call {PLAN} with the steps, each naming the tool it will use. Then call the tools;"
    " several read-only calls in one reply run together. Give each tool call the plan step it"
    f" carries out in its `{PLAN_STEP}` argument. When the task is done, or cannot be done,"
    f" call {FINAL}. Reply with function calls only."
)

_PLAN_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "steps": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "id": {"type": "string", "description": "a short id such as s1"},
                    "tool": {"type": "string", "description": "the tool this step calls"},
                    "depends_on": {"type": "array", "items": {"type": "string"}},
                },
                "required": ["id", "tool", "depends_on"],
            },
        }
    },
    "required": ["steps"],
}
_FINAL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "outcome": {"type": "string", "enum": ["completed", "cannot_complete", "escalate"]},
        "text": {"type": "string", "description": "the answer to the customer"},
    },
    "required": ["outcome", "text"],
}


@dataclass(frozen=True)
class Function:
    name: str
    description: str
    parameters: Mapping[str, Any]


def functions(tools: Sequence[ToolSpec]) -> list[Function]:
    """The job's tools, each taking an optional plan step, then the plan and final functions."""
    out = []
    for tool in tools:
        schema = dict(tool.schema)
        properties = dict(schema.get("properties") or {})
        properties[PLAN_STEP] = {"type": "string", "description": "the plan step this carries out"}
        schema["properties"] = properties
        out.append(Function(tool.name, tool.description or tool.name, schema))
    out.append(
        Function(PLAN, "Propose the plan: the steps and the tool each one uses.", _PLAN_SCHEMA)
    )
    out.append(
        Function(FINAL, "Finish: the outcome and the answer to the customer.", _FINAL_SCHEMA)
    )
    return out


@dataclass(frozen=True)
class PastCall:
    """One call of the previous turn with its observation, as the exchange to re-create."""

    id: str
    name: str
    arguments: dict[str, Any]
    result: Any

    @property
    def result_text(self) -> str:
        return json.dumps(self.result, sort_keys=True)

    @property
    def failed(self) -> bool:
        return isinstance(self.result, Mapping) and self.result.get("status") == "error"


def past_calls(request: ModelRequest) -> list[PastCall]:
    """The previous turn's calls paired with their observations; none when they do not pair."""
    calls, result = request.previous_calls, request.last_result
    if not calls:
        return []
    if len(calls) == 1:
        results: list[Any] = [result]
    elif isinstance(result, list) and len(result) == len(calls):
        results = [
            {k: v for k, v in r.items() if k not in ("call", "tool")}
            if isinstance(r, Mapping)
            else r
            for r in result
        ]
    else:
        return []
    out = []
    for index, (call, observed) in enumerate(zip(calls, results, strict=True)):
        arguments = dict(call.args)
        if call.plan_step is not None:
            arguments[PLAN_STEP] = call.plan_step
        out.append(
            PastCall(f"call_t{request.step - 1}_{index + 1}", call.name, arguments, observed)
        )
    return out


def malformed(problem: str) -> dict[str, Any]:
    return {"type": MALFORMED, "problem": problem[:300]}


def _arguments(name: str, raw: str | Mapping[str, Any] | None) -> dict[str, Any] | str:
    """The call's arguments as an object, or the problem with them."""
    if raw is None or raw == "":
        return {}
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError as exc:
            return f"the arguments of {name} are not valid JSON ({exc}); send a JSON object"
    if not isinstance(raw, Mapping):
        return f"the arguments of {name} must be a JSON object"
    return dict(raw)


def reply_from(calls: Sequence[tuple[str, str | Mapping[str, Any] | None]], text: str) -> Any:
    """The kernel reply for the model's function calls (name, arguments) and its text."""
    if not calls and not text.strip():
        return malformed("the reply was empty; call a function")
    if not calls:
        return malformed(f"the reply had no function call; call a function. It said: {text[:200]}")
    parsed = []
    for name, raw in calls:
        arguments = _arguments(name, raw)
        if isinstance(arguments, str):
            return malformed(arguments)
        parsed.append((name, arguments))
    return _reply_of(parsed)


def _reply_of(parsed: list[tuple[str, dict[str, Any]]]) -> Any:
    names = [name for name, _ in parsed]
    if (PLAN in names or FINAL in names) and len(parsed) > 1:
        return malformed(f"{PLAN} and {FINAL} must each be the only call of a reply")
    name, arguments = parsed[0]
    if name == PLAN:
        return {"type": "plan", "steps": arguments.get("steps")}
    if name == FINAL:
        return {"type": "final", **arguments}
    tool_calls = []
    for name, arguments in parsed:
        step = arguments.pop(PLAN_STEP, None)
        tool_calls.append(
            {"name": name, "args": arguments, PLAN_STEP: step if isinstance(step, str) else None}
        )
    if len(tool_calls) == 1:
        return {"type": "tool", **tool_calls[0]}
    return {"type": "tools", "calls": tool_calls}


class AnswerText:
    """The words of a final answer as its function call's arguments stream in: each `feed` of
    the arguments so far (JSON that may be cut anywhere) gives the part of its `text` not given
    before, so the deltas join to the text the reply will hold. Other functions give nothing."""

    def __init__(self) -> None:
        self.said = 0

    def feed(self, name: str | None, arguments: str) -> str:
        if name != FINAL or not arguments:
            return ""
        try:
            parsed = jiter.from_json(arguments.encode(), partial_mode="trailing-strings")
        except ValueError:
            return ""  # not an object (yet): the reply's parse will say what is wrong
        text = parsed.get("text") if isinstance(parsed, dict) else None
        if not isinstance(text, str) or len(text) <= self.said:
            return ""
        delta = text[self.said :]
        self.said = len(text)
        return delta
