"""MCP servers as a job's tools, as the kernel sees them: what a job declares, and the pure
rules that make a server's listed tool a kernel `Tool` and its answer a tool result.

A job declares its servers (`Job(mcp=[McpServer(...)])`): a command to start (stdio) or a URL
(streamable HTTP), headers or environment for every run, and, for a server that needs them per
tenant, a flag saying so (the values come from the worker's secrets file, never from a run).
Nothing a run carries (its goal, params or a model's arguments) can name a server, a command
or a URL: the declaration is frozen data in the job's code.

The client that connects, lists and calls lives in the worker (`turnstile.worker.mcp`); these
rules are the contract it applies:

- `readOnlyHint: true` makes a read (run with the batch's other reads); anything else is a
  write (one at a time, under the job's approval policy, its idempotency key sent in the
  request's `_meta` as `turnstile/idempotency-key`). A write is irreversible unless the server
  says `destructiveHint: false`, so by default a person approves it (`tighten`), unless the
  job's policy grants it (`GRANT_RULE`);
- a result with `isError` is a `ToolError("tool_error", text)` the model sees;
  `structuredContent` is the call's value (its fields named in `facts` become facts); other
  content is its text (one block: a string; several: a list), an image or audio block a
  short description of it (never its bytes);
- a listed tool whose schema is not JSON Schema, whose name is not one a model can call or
  clashes with another tool is left out, with one line saying why.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from turnstile.jobs.errors import JobDefinitionError
from turnstile.jobs.tools import Tool, ToolContext, ToolError, one_line

SERVER_NAME = re.compile(r"[a-z][a-z0-9_\-]{0,31}")
# What every provider takes as a function name (OpenAI's pattern, Anthropic's is the same).
TOOL_NAME = re.compile(r"[A-Za-z0-9_\-]{1,64}")
# The request's `_meta` keys a call carries (MCP's `prefix/name` form, our own prefix).
KEY_META = "turnstile/idempotency-key"
RUN_META = "turnstile/run-id"
APPROVED_META = "turnstile/approved"
DEFAULT_TIMEOUT_S = 600.0  # a call's own limit; the run's remaining deadline is usually less
MAX_ERROR_CHARS = 2000  # what the model is shown of an isError result's text


def _names(value: object, option: str, server: str) -> tuple[str, ...]:
    """A sequence of names as a tuple; one bare string is the classic slip, refused."""
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise JobDefinitionError(
            f"MCP server {server!r}: {option} must be a tuple of tool names, e.g. "
            f"{option}=({value!r},)"
        )
    names = tuple(value)
    if not all(isinstance(n, str) and n for n in names):
        raise JobDefinitionError(f"MCP server {server!r}: {option} must name tools by text")
    return names


def _text_map(value: object, option: str, server: str) -> dict[str, str]:
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise JobDefinitionError(f"MCP server {server!r}: {option} must map text to text")
    return dict(value)


@dataclass(frozen=True, eq=False)
class McpServer:
    """One MCP server whose tools a job offers its model.

    Give `command` (and `args`, `env`, `cwd`) to start it as a child of the worker process and
    talk over its stdin and stdout, or `url` for a streamable HTTP server (`headers` sent with
    every request). `per_tenant=True`: each tenant gets a connection of its own, with the
    headers (HTTP) or environment (stdio) the worker's secrets file gives that tenant
    (TURNSTILE_MCP_SECRETS_FILE). `allow` (None: all) and `deny` pick the server's tools by the
    names it lists; `prefix` is put before each name as the model sees it (`crm_` makes
    `crm_lookup`); `facts` names, per tool, the fields of its structured result that become
    facts. Each call is bounded by `timeout_s` and by the run's remaining deadline, whichever
    is less, and reserves `cost_bound_microusd`; `connect_timeout_s` bounds the handshake and
    first listing (None: the worker's setting)."""

    name: str
    command: str | None = None
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None
    url: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    per_tenant: bool = False
    allow: tuple[str, ...] | None = None
    deny: tuple[str, ...] = ()
    prefix: str = ""
    facts: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    timeout_s: float = DEFAULT_TIMEOUT_S
    cost_bound_microusd: int = 0
    connect_timeout_s: float | None = None  # None: the worker's TURNSTILE_MCP_CONNECT_TIMEOUT_S

    def __post_init__(self) -> None:
        name = self.name
        if not isinstance(name, str) or not SERVER_NAME.fullmatch(name):
            raise JobDefinitionError(
                f"MCP server name {name!r}: lower-case letters, digits, '_' or '-', at most 32"
            )
        self._check_transport()
        object.__setattr__(self, "args", _names(self.args, "args", name))
        object.__setattr__(self, "env", _text_map(self.env, "env", name))
        object.__setattr__(self, "headers", _text_map(self.headers, "headers", name))
        if self.allow is not None:
            object.__setattr__(self, "allow", _names(self.allow, "allow", name))
        object.__setattr__(self, "deny", _names(self.deny, "deny", name))
        if not isinstance(self.prefix, str) or (
            self.prefix and not TOOL_NAME.fullmatch(self.prefix)
        ):
            raise JobDefinitionError(
                f"MCP server {name!r}: prefix must be letters, digits, '_' or '-'"
            )
        if not isinstance(self.facts, Mapping):
            raise JobDefinitionError(f"MCP server {name!r}: facts must map a tool to fields")
        facts = {tool: _names(fields, f"facts[{tool!r}]", name) for tool, fields in
                 self.facts.items()}  # fmt: skip
        object.__setattr__(self, "facts", facts)
        self._check_numbers()

    def _check_transport(self) -> None:
        name, command, url = self.name, self.command, self.url
        if (command is None) == (url is None):
            raise JobDefinitionError(
                f"MCP server {name!r}: give either command= (stdio) or url= (streamable HTTP)"
            )
        if command is not None and (not isinstance(command, str) or not command.strip()):
            raise JobDefinitionError(f"MCP server {name!r}: command must be a program to run")
        if url is not None and (
            not isinstance(url, str) or not re.fullmatch(r"https?://[^\s/]+(/\S*)?", url)
        ):
            raise JobDefinitionError(
                f"MCP server {name!r}: url must be an http:// or https:// URL, got {url!r:.80}"
            )
        if command is None and (self.args or self.env or self.cwd is not None):
            raise JobDefinitionError(
                f"MCP server {name!r}: args, env and cwd are for a command (stdio)"
            )
        if url is None and self.headers:
            raise JobDefinitionError(f"MCP server {name!r}: headers are for a url (HTTP)")
        if not isinstance(self.per_tenant, bool):
            raise JobDefinitionError(f"MCP server {name!r}: per_tenant must be True or False")

    def _check_numbers(self) -> None:
        cost = self.cost_bound_microusd
        for option in ("timeout_s", "connect_timeout_s"):
            value = getattr(self, option)
            if value is None and option == "connect_timeout_s":
                continue
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise JobDefinitionError(f"MCP server {self.name!r}: {option} must be seconds > 0")
        if not isinstance(cost, int) or isinstance(cost, bool) or cost < 0:
            raise JobDefinitionError(
                f"MCP server {self.name!r}: cost_bound_microusd must be a whole number >= 0"
            )

    @property
    def transport(self) -> str:
        """`stdio` (a command the worker starts) or `http` (a URL)."""
        return "stdio" if self.command is not None else "http"

    @property
    def where(self) -> str:
        """What the server is, in one line (never a header's or an env variable's value)."""
        if self.command is not None:
            return one_line(" ".join([self.command, *self.args]), 120)
        return str(self.url)


def check_servers(job: str, servers: object) -> tuple[McpServer, ...]:
    """A job's servers as a tuple, each an `McpServer` with a name of its own. A function is
    refused: what a run carries never chooses a server, a command or a URL."""
    if isinstance(servers, str | bytes | Mapping) or not isinstance(servers, Sequence):
        raise JobDefinitionError(
            f"job {job!r}: mcp must be a list of McpServer, e.g. mcp=[McpServer(...)]"
        )
    seen: set[str] = set()
    for server in servers:
        if not isinstance(server, McpServer):
            raise JobDefinitionError(
                f"job {job!r}: mcp holds {type(server).__name__}, not an McpServer: servers are "
                "declared in the job, never built from a run's input"
            )
        if server.name in seen:
            raise JobDefinitionError(f"job {job!r}: MCP server {server.name!r} is declared twice")
        seen.add(server.name)
    return tuple(servers)


# -- a listed tool as a kernel tool ---------------------------------------------------------


def selected(server: McpServer, listed: Sequence[str]) -> tuple[list[str], list[str]]:
    """The listed names the job offers (in listed order), and one line per allow-listed name
    the server does not list."""
    kept = [
        n for n in listed if (server.allow is None or n in server.allow) and n not in server.deny
    ]
    missing = [
        f"MCP server {server.name!r} lists no tool {n!r} (allow-listed)"
        for n in server.allow or ()
        if n not in listed
    ]
    return kept, missing


def make_tool(
    server: McpServer, definition: Mapping[str, Any], fn: Callable[[ToolContext], Any]
) -> Tool:
    """The kernel tool for one tool a server listed (its JSON, as the protocol spells it):
    `fn` makes the call. A definition that cannot be one is a JobDefinitionError, one line."""
    remote = definition.get("name")
    if not isinstance(remote, str):
        raise JobDefinitionError(f"MCP server {server.name!r} listed a tool without a name")
    name = server.prefix + remote
    if not TOOL_NAME.fullmatch(name):
        raise JobDefinitionError(
            f"MCP tool {remote!r:.80} of server {server.name!r}: a model cannot call it by "
            "that name (letters, digits, '_' and '-', at most 64)"
        )
    schema = definition.get("inputSchema")
    if not isinstance(schema, Mapping) or schema.get("type") != "object":
        raise JobDefinitionError(
            f"MCP tool {name!r} of server {server.name!r}: its inputSchema is not an object schema"
        )
    hints = _hints(definition)
    mutates = not reads(definition)
    description = definition.get("description")
    try:
        return Tool(
            name=name,
            fn=fn,
            schema=dict(schema),
            description=description if isinstance(description, str) and description else name,
            mutates=mutates,
            reversible=not mutates or hints.get("destructiveHint") is False,
            cost_bound_microusd=server.cost_bound_microusd,
            timeout_s=server.timeout_s,
            facts=tuple(server.facts.get(remote, ())),
        )
    except JobDefinitionError as exc:
        raise JobDefinitionError(f"MCP server {server.name!r}: {exc}"[:300]) from None


def _hints(definition: Mapping[str, Any]) -> Mapping[str, Any]:
    hints = definition.get("annotations")
    return hints if isinstance(hints, Mapping) else {}


def reads(definition: Mapping[str, Any]) -> bool:
    """Whether a listed tool is a read: only a `readOnlyHint` of true says so."""
    return _hints(definition).get("readOnlyHint") is True


def call_meta(ctx: ToolContext) -> dict[str, Any]:
    """What a call carries in its request's `_meta`: the idempotency key (the same logical
    write always carries the same one), the run, and whether a person approved this call."""
    meta: dict[str, Any] = {KEY_META: ctx.key, RUN_META: ctx.run_id}
    if ctx.approved:
        meta[APPROVED_META] = True
    return meta


# -- an answer as a tool result -------------------------------------------------------------


def _block(block: Mapping[str, Any]) -> Any:
    """One content block as the model is shown it: text as is, media as a short line."""
    kind = block.get("type")
    if kind == "text":
        return block.get("text", "")
    if kind in ("image", "audio"):
        data = block.get("data")
        size = len(data) * 3 // 4 if isinstance(data, str) else 0
        return {"type": kind, "mimeType": block.get("mimeType"), "bytes": size}
    if kind == "resource":
        resource = block.get("resource")
        resource = resource if isinstance(resource, Mapping) else {}
        out = {"type": "resource", "uri": resource.get("uri")}
        if isinstance(resource.get("text"), str):
            out["text"] = resource["text"]
        return out
    if kind == "resource_link":
        return {"type": "resource_link", "uri": block.get("uri"), "name": block.get("name")}
    return {"type": str(kind)[:40]}


def result_value(result: Mapping[str, Any]) -> Any:
    """A `tools/call` result (its JSON) as the tool's value, or the ToolError the model sees
    for an `isError` one. The kernel bounds the value's size as for any tool."""
    content = result.get("content")
    blocks = [b for b in content if isinstance(b, Mapping)] if isinstance(content, list) else []
    if result.get("isError") is True:
        said = " ".join(str(b.get("text", "")) for b in blocks if b.get("type") == "text")
        raise ToolError("tool_error", one_line(said or "the tool reported an error",
                                               MAX_ERROR_CHARS))  # fmt: skip
    if result.get("structuredContent") is not None:
        return result["structuredContent"]
    values = [_block(b) for b in blocks]
    if len(values) == 1:
        return values[0]
    return values
