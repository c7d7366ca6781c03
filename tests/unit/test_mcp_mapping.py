"""The pure rules of a job's MCP servers (turnstile/jobs/mcp.py): what a declaration may say,
how a listed tool becomes a kernel tool, and how an answer becomes its result."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests.unit.kit import call, go
from turnstile import Job, JobDefinitionError, McpServer, Scripted, ToolContext, ToolError
from turnstile.jobs.mcp import call_meta, make_tool, result_value, selected
from turnstile.jobs.outcomes import Outcome

SCHEMA = {"type": "object", "properties": {"order": {"type": "string"}}, "required": ["order"]}
SERVER = McpServer("crm", url="https://crm.example/mcp")


def listed(name: str = "lookup", **annotations: Any) -> dict[str, Any]:
    return {"name": name, "description": "Look it up.", "inputSchema": SCHEMA,
            "annotations": annotations}  # fmt: skip


def fn(ctx: ToolContext) -> Any:
    return {"order": ctx.args["order"], "state": "shipped"}


def test_read_only_hint_makes_a_read_and_anything_else_a_write() -> None:
    """`readOnlyHint: true` is a read; no hint, or false, is a write, irreversible unless the
    server says `destructiveHint: false`."""
    read = make_tool(SERVER, listed(readOnlyHint=True), fn)
    assert (read.mutates, read.reversible) == (False, True)
    write = make_tool(SERVER, listed(), fn)
    assert (write.mutates, write.reversible) == (True, False)
    additive = make_tool(SERVER, listed(readOnlyHint=False, destructiveHint=False), fn)
    assert (additive.mutates, additive.reversible) == (True, True)
    assert make_tool(SERVER, {**listed(), "annotations": None}, fn).mutates is True


def test_a_listed_tool_takes_the_servers_prefix_bounds_and_facts() -> None:
    """The model sees the prefixed name; the call is bounded by the server's timeout and cost,
    and the facts named for the tool are kept."""
    server = McpServer("crm", url="https://crm.example/mcp", prefix="crm_", timeout_s=20,
                       cost_bound_microusd=7, facts={"lookup": ("state",)})  # fmt: skip
    made = make_tool(server, listed(readOnlyHint=True), fn)
    assert (made.name, made.timeout_s, made.cost_bound_microusd, made.facts) == (
        "crm_lookup",
        20,
        7,
        ("state",),
    )
    assert made.description == "Look it up."
    assert made.argument_problems({"order": 5}) == ["order: 5 is not of type 'string'"]


@pytest.mark.parametrize(
    ("definition", "said"),
    [
        ({**listed(), "inputSchema": {"type": "object", "properties": {"x": {"type": "strng"}}}},
         "its schema is not valid JSON Schema"),
        ({**listed(), "inputSchema": {"type": "array"}}, "its inputSchema is not an object schema"),
        (listed("has space"), "a model cannot call it by that name"),
        (listed("x" * 65), "a model cannot call it by that name"),
        ({"inputSchema": SCHEMA}, "listed a tool without a name"),
    ],
)  # fmt: skip
def test_a_tool_that_cannot_be_offered_is_refused_in_one_line(
    definition: dict[str, Any], said: str
) -> None:
    """A schema that is not JSON Schema or not an object, a name no model can call, no name:
    one line naming the server and the tool."""
    with pytest.raises(JobDefinitionError, match="crm") as caught:
        make_tool(SERVER, definition, fn)
    assert said in str(caught.value) and "\n" not in str(caught.value)


def test_allow_and_deny_pick_the_tools_and_a_missing_allowed_one_is_said() -> None:
    """`allow` keeps only the names it lists, `deny` drops its names; an allow-listed name the
    server does not list is one line."""
    server = McpServer("crm", url="https://crm.example/mcp", allow=("a", "b", "z"), deny=("b",))
    kept, problems = selected(server, ["a", "b", "c"])
    assert kept == ["a"]
    assert problems == ["MCP server 'crm' lists no tool 'z' (allow-listed)"]
    assert selected(McpServer("crm", url="https://c.example/mcp"), ["a", "c"]) == (["a", "c"], [])


def test_an_answer_is_its_structured_content_or_its_text_and_an_error_is_a_tool_error() -> None:
    """`structuredContent` is the value; otherwise one text block is its text, several a
    list, an image a short description (never its bytes); `isError` is a ToolError with the
    server's text."""
    text = {"type": "text", "text": "shipped"}
    assert result_value({"content": [text], "structuredContent": {"state": "shipped"}}) == {
        "state": "shipped"
    }
    assert result_value({"content": [text]}) == "shipped"
    image = {"type": "image", "data": "QUJD" * 100, "mimeType": "image/png"}
    assert result_value({"content": [text, image]}) == [
        "shipped",
        {"type": "image", "mimeType": "image/png", "bytes": 300},
    ]
    with pytest.raises(ToolError) as caught:
        result_value({"content": [{"type": "text", "text": "order is\nlocked"}], "isError": True})
    assert (caught.value.code, caught.value.detail) == ("tool_error", "order is locked")


def test_a_call_carries_its_idempotency_key_run_and_approval_in_meta() -> None:
    """The request's `_meta` names the call's key and run, and says when a person approved it."""
    ctx = ToolContext("r1", "acme", "u", {}, {"order": "A"}, "r1:s2", 5.0, approved=True)
    assert call_meta(ctx) == {"turnstile/idempotency-key": "r1:s2", "turnstile/run-id": "r1",
                              "turnstile/approved": True}  # fmt: skip


@pytest.mark.parametrize(
    ("options", "said"),
    [
        ({}, "give either command= (stdio) or url= (streamable HTTP)"),
        ({"command": "x", "url": "https://a.example/mcp"}, "give either command="),
        ({"url": "ftp://a.example"}, "url must be an http:// or https:// URL"),
        ({"url": "https://a.example/mcp", "env": {"K": "v"}}, "env and cwd are for a command"),
        ({"command": "x", "headers": {"A": "b"}}, "headers are for a url"),
        ({"command": "x", "allow": "lookup"}, "allow must be a tuple of tool names"),
        ({"command": "x", "timeout_s": 0}, "timeout_s must be seconds > 0"),
        ({"command": "x", "cost_bound_microusd": 1.5}, "cost_bound_microusd must be a whole"),
        ({"command": "x", "prefix": "a b"}, "prefix must be letters"),
    ],
)  # fmt: skip
def test_a_server_declared_wrongly_is_refused_in_one_line(
    options: dict[str, Any], said: str
) -> None:
    """Each mistake in a declaration is a JobDefinitionError naming the server and the fix."""
    with pytest.raises(JobDefinitionError, match="MCP server 'crm'") as caught:
        McpServer("crm", **options)
    assert said in str(caught.value)


def test_a_job_takes_only_declared_servers_never_a_function_of_the_run() -> None:
    """`Job(mcp=...)` holds McpServer declarations with names of their own: a function (which
    could build a server from a run's params) and a name declared twice are refused, and a
    server's cost bound counts in the job's per-call reserve."""
    model = Scripted(lambda view, i: {"type": "final", "outcome": "completed", "text": ""})
    with pytest.raises(JobDefinitionError, match="never built from a run's input"):
        Job(name="j", tools={}, model=model, mcp=[lambda params: SERVER])  # type: ignore[list-item]
    with pytest.raises(JobDefinitionError, match="declared twice"):
        Job(name="j", tools={}, model=model, mcp=[SERVER, SERVER])
    with pytest.raises(JobDefinitionError, match="a list of McpServer"):
        Job(name="j", tools={}, model=model, mcp=SERVER)  # type: ignore[arg-type]
    costly = McpServer("crm", url="https://crm.example/mcp", cost_bound_microusd=900)
    assert Job(name="j", tools={}, model=model, mcp=[costly]).tool_cost_bound_microusd == 900


def test_an_mcp_write_is_held_for_approval_unless_the_job_grants_it() -> None:
    """In the kernel, an MCP write the server did not call additive is held for a person, as
    any irreversible write; its read runs with the batch."""
    tools = {t.name: t for t in (make_tool(SERVER, listed("lookup", readOnlyHint=True), fn),
                                 make_tool(SERVER, listed("close"), fn))}  # fmt: skip
    model = Scripted(lambda view, i: call("close", order="A") if i == 2 else
                     call("lookup", order="A"))  # fmt: skip
    ran = go(Job(name="j", tools=tools, model=model), model)
    assert ran.state.outcome is Outcome.NEEDS_APPROVAL
    assert ran.state.pending is not None and ran.state.pending.call.name == "close"


def test_the_docs_mcp_example_declares_its_servers() -> None:
    """The MCP page's example is real code: a job with an HTTP server per tenant and a stdio
    one, nothing connected by declaring them."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "mcp.md").read_text()
    (block,) = re.findall(r"```python\n(.*?)```", text, re.DOTALL)
    namespace: dict[str, Any] = {"__name__": "readme_mcp"}
    exec(compile(block, "docs/mcp.md", "exec"), namespace)  # noqa: S102 - our docs
    job = namespace["job"]
    assert [(s.name, s.transport, s.per_tenant) for s in job.mcp] == [
        ("crm", "http", True),
        ("files", "stdio", False),
    ]
    assert job.tools == {}
