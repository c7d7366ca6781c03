"""Jobs whose tools come from the MCP servers of tests/mcp_servers.py, named through
TURNSTILE_JOBS by the MCP tests. Each is built in the worker from what the test put in its
environment (where the servers record, the HTTP servers' URLs): operator configuration, as a
deployment's job would read its settings; never from a run.

Their scripted models call the tools in a fixed order (the model's reply for turn N is the
N-th of the script, the last one repeated), so a test knows every call a run makes."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from turnstile import Budget, Job, McpServer, Scripted, ToolContext, tool

ROOT = Path(__file__).parents[1]
DESK_TOOLS = ("lookup_order", "add_note")
FACTS = {"lookup_order": ("state", "carrier")}
WIRE = Budget(max_tokens=40_000)


def stdio(name: str = "desk", variant: str = "good", **options: Any) -> McpServer:
    """The test server as a child of the worker, recording to MCP_TEST_RECORD."""
    record = os.environ.get("MCP_TEST_RECORD", "/dev/null")
    return McpServer(name, command=sys.executable, cwd=str(ROOT),
                     args=("-m", "tests.mcp_servers", record, "stdio", variant),
                     **options)  # fmt: skip


def http(name: str = "desk", url_variable: str = "MCP_TEST_URL", **options: Any) -> McpServer:
    """The test server the test started, at the URL in `url_variable`."""
    return McpServer(name, url=os.environ.get(url_variable, "http://127.0.0.1:9/mcp"), **options)


def call(name: str, **args: Any) -> dict[str, Any]:
    return {"type": "tool", "name": name, "args": args}


def final(text: str = "done") -> dict[str, Any]:
    return {"type": "final", "outcome": "completed", "text": text}


def script(*replies: dict[str, Any] | Callable[[Any, int], dict[str, Any]]) -> Scripted:
    """The model: reply N to turn N (the last one again after), each at 0.1 s."""

    def reply(view: Any, step: int) -> dict[str, Any]:
        chosen = replies[min(step, len(replies)) - 1]
        return chosen(view, step) if callable(chosen) else chosen

    return Scripted(reply, 0.1)


def _desk(view: Any, step: int) -> dict[str, Any]:
    facts = view["facts"]
    return final(f"order is {facts.get('state')} with {facts.get('carrier')}")


DESK_SCRIPT = (call("lookup_order", order="A-1"), call("add_note", order="A-1", note="called"),
               _desk)  # fmt: skip


def desk() -> Job:
    """Every tool from the stdio server; the scripted model looks an order up, notes it."""
    return Job(name="mcp_desk", tools={}, model=lambda p: script(*DESK_SCRIPT),
               mcp=[stdio(allow=DESK_TOOLS, facts=FACTS)])  # fmt: skip


def desk_http() -> Job:
    """The same over streamable HTTP."""
    return Job(name="mcp_desk_http", tools={}, model=lambda p: script(*DESK_SCRIPT),
               mcp=[http(allow=DESK_TOOLS, facts=FACTS)])  # fmt: skip


def desk_openai() -> Job:
    """The same tools on the fake OpenAI server's agent (tests/wire/agent.py), stdio."""
    return Job(name="mcp_desk_openai", tools={}, model="openai:gpt-4.1-mini", budget=WIRE,
               mcp=[stdio(allow=DESK_TOOLS, facts=FACTS)])  # fmt: skip


def desk_openai_http() -> Job:
    return Job(name="mcp_desk_openai_http", tools={}, model="openai:gpt-4.1-mini", budget=WIRE,
               mcp=[http(allow=DESK_TOOLS, facts=FACTS)])  # fmt: skip


def slow() -> Job:
    """A read that takes a minute, in a run with three seconds: stdio."""
    return Job(name="mcp_slow", tools={}, budget=Budget(deadline_ms=3000),
               model=lambda p: script(call("slow_read", seconds=60), final()),
               mcp=[stdio(allow=("slow_read",))])  # fmt: skip


def slow_http() -> Job:
    return Job(name="mcp_slow_http", tools={}, budget=Budget(deadline_ms=3000),
               model=lambda p: script(call("slow_read", seconds=60), final()),
               mcp=[http(allow=("slow_read",))])  # fmt: skip


def approve() -> Job:
    """An irreversible MCP write (no `destructiveHint: false`): held for a person."""
    return Job(name="mcp_approve", tools={},
               model=lambda p: script(call("create_ticket", title="printer on fire"), final()),
               mcp=[http(allow=("create_ticket",))])  # fmt: skip


def slow_write() -> Job:
    """A write that takes `seconds` (a param) to answer: the worker is killed meanwhile."""

    def model(params: Mapping[str, Any]) -> Scripted:
        seconds = float(params.get("seconds", 8))
        return script(call("slow_write", title="reorder", seconds=seconds), final())

    schema = {"type": "object", "properties": {"seconds": {"type": "number"}},
              "additionalProperties": False}  # fmt: skip
    return Job(name="mcp_slow_write", tools={}, model=model, params_schema=schema,
               mcp=[http(allow=("slow_write",))])  # fmt: skip


def dies() -> Job:
    """A stdio server that exits in the middle of each call."""
    return Job(name="mcp_dies", tools={}, budget=Budget(max_tool_failures=2),
               model=lambda p: script(lambda v, i: call("die", n=i)),
               mcp=[stdio(allow=("die",))])  # fmt: skip


def down() -> Job:
    """An HTTP server the test stops after the worker listed its tools."""
    return Job(name="mcp_down", tools={}, budget=Budget(max_tool_failures=2),
               model=lambda p: script(lambda v, i: call("lookup_order", order=f"A-{i}")),
               mcp=[http(url_variable="MCP_TEST_DOWN_URL", allow=("lookup_order",))])  # fmt: skip


@tool
def echo(ctx: ToolContext, text: str) -> str:
    """Say the text back."""
    return text


def bad() -> Job:
    """A Python tool, a server listing tools that cannot be offered, and one that never
    answers; the model asks for an oversized answer, then for a line that is not JSON-RPC,
    then for a good read."""
    replies = (call("huge", size=400_000), call("garbage"), call("lookup_order", order="A-1"),
               call("echo", text="still here"), final())  # fmt: skip
    return Job(name="mcp_bad", tools={"echo": echo}, model=lambda p: script(*replies),
               budget=Budget(max_steps=8, max_stalls=6),
               mcp=[stdio("shop", variant="bad", deny=("die",)),
                    stdio("mute", variant="silent", connect_timeout_s=2)])  # fmt: skip


def _fresh(view: Any, step: int) -> dict[str, Any]:
    last = view.get("last_result") or {}
    if last.get("status") == "ok" and step > 2:
        return final("fresh answered")
    return call("fresh")


def grow() -> Job:
    """A tool the server adds while the run goes on, announcing the change."""
    return Job(name="mcp_grow", tools={}, budget=Budget(max_steps=8, max_repeat=6, max_stalls=6),
               model=lambda p: script(call("grow"), _fresh), mcp=[stdio()])  # fmt: skip


def per_tenant() -> Job:
    """An HTTP server given each tenant's own token (TURNSTILE_MCP_SECRETS_FILE)."""
    return Job(name="mcp_tenant", tools={},
               model=lambda p: script(call("lookup_order", order="A-1"), final()),
               mcp=[http("tenanted", per_tenant=True, allow=("lookup_order",))])  # fmt: skip


@tool(mutates=True, reversible=False)
def post_notice(ctx: ToolContext, text: str) -> dict[str, Any]:
    """Post a notice to every customer (it cannot be taken back)."""
    return {"posted": text}


def notice() -> Job:
    """A Python job whose one write waits for a person: what `turnstile mcp` drives."""
    replies = (call("post_notice", text="closed today"), final("posted"))
    return Job(name="notice", tools={"post_notice": post_notice}, model=lambda p: script(*replies))


NAMES = ("desk", "desk_http", "desk_openai", "desk_openai_http", "slow", "slow_http", "approve",
         "slow_write", "dies", "down", "bad", "grow", "per_tenant", "notice")  # fmt: skip
SPEC = ",".join(f"tests.mcp_jobs:{name}" for name in NAMES)
