"""A worker process's MCP toolbox: one connection per declared server (and per tenant, for a
per-tenant server), and each job as its turns see it: its Python tools and the tools its
servers list, made kernel `Tool`s by the rules of `turnstile.jobs.mcp`.

`job(job, tenant)` is what a step asks for; it connects a server the first time (within the
connect timeout) and rebuilds the job only when a listing changed. A listed tool that cannot
be one (a schema that is not JSON Schema, a name a model cannot call, a name another tool has)
is left out with one warning line; a server that cannot be reached offers no tools until it
answers, and the tools it listed before keep failing at once with the reason (a tool failure
the model sees). Nothing here raises into a step.

This module imports the `mcp` package only when a connection is first made, so a worker whose
jobs declare no server never loads it.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Iterable, Mapping
from contextlib import suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
import structlog

from turnstile.errors import TurnstileError
from turnstile.jobs.errors import JobDefinitionError
from turnstile.jobs.job import Job
from turnstile.jobs.mcp import McpServer, call_meta, make_tool, reads, result_value, selected
from turnstile.jobs.tools import Tool, ToolContext, ToolFn, ToolOutput, one_line
from turnstile.worker.settings import Settings

if TYPE_CHECKING:
    from turnstile.worker.mcp._loop import Loop
    from turnstile.worker.mcp._session import Connection, Listing

log = structlog.get_logger("turnstile.mcp")

EVERY_TENANT = "*"  # the secrets file's entry for every tenant
CLOSE_WAIT_S = 3.0  # for the sessions to end when the process stops (a stdio server's grace: 2 s)
Secrets = Mapping[str, Mapping[str, Mapping[str, str]]]


class McpConfigError(TurnstileError):
    """The MCP secrets file cannot be read as {"server": {"tenant" or "*": {"name": "value"}}}."""


def load_secrets(path: str | None) -> Secrets:
    """The secrets file (TURNSTILE_MCP_SECRETS_FILE), checked: {} when none is set."""
    if not path:
        return {}
    where = f"TURNSTILE_MCP_SECRETS_FILE {path}"
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise McpConfigError(one_line(f"{where}: {exc}")) from None
    shape = '{"<server>": {"*" or "<tenant>": {"<header or variable>": "<value>"}}}'
    if not isinstance(data, dict):
        raise McpConfigError(f"{where}: expected {shape}")
    for server, tenants in data.items():
        if not isinstance(tenants, dict) or not all(
            isinstance(values, dict) and all(isinstance(v, str) for v in values.values())
            for values in tenants.values()
        ):
            raise McpConfigError(f"{where}: server {server!r}: expected {shape}")
    return data


class Quiet:
    """A logger that says nothing."""

    def _nothing(self, event: str, **fields: Any) -> None:
        return None

    debug = info = warning = error = _nothing


def _identity(server: McpServer) -> tuple[Any, ...]:
    """What makes two declarations the same server (two jobs may declare one)."""
    return (server.name, server.command, server.args, tuple(sorted(server.env.items())),
            server.cwd, server.url, tuple(sorted(server.headers.items())))  # fmt: skip


def _tool_fn(connection: Connection, remote: str, *, mutates: bool) -> ToolFn:
    """The kernel's function for one MCP tool: the call, its answer as the tool's result."""

    def call(ctx: ToolContext) -> Any:
        answer = connection.call(
            remote, ctx.args, call_meta(ctx), timeout_s=ctx.timeout_s, mutates=mutates
        )
        return answer if isinstance(answer, ToolOutput) else result_value(answer)

    call.__name__ = remote
    return call


def describe_tool(tool: Tool) -> dict[str, Any]:
    """A tool as `turnstile jobs NAME` shows it."""
    return {"name": tool.name, "description": tool.description,
            "schema": msgspec.to_builtins(tool.schema), "mutates": tool.mutates,
            "reversible": tool.reversible, "timeout_s": tool.timeout_s}  # fmt: skip


class Toolbox:
    """The MCP connections of one worker process, and its jobs with their MCP tools."""

    def __init__(
        self, *, secrets: Secrets | None = None, connect_timeout_s: float = 10.0,
        retry_s: float = 15.0, quiet: bool = False,
    ) -> None:  # fmt: skip
        """`quiet`: log nothing (a command that shows what it finds, `turnstile jobs NAME`)."""
        self.secrets = dict(secrets or {})
        self.log: Any = Quiet() if quiet else log
        self.connect_timeout_s, self.retry_s = connect_timeout_s, retry_s
        self._lock = threading.Lock()
        self._loop: Loop | None = None
        self._connections: dict[tuple[Any, ...], Connection] = {}
        self._jobs: dict[tuple[int, str], tuple[tuple[int, ...], Job]] = {}
        self._said: set[str] = set()

    @classmethod
    def from_settings(cls, config: Settings, *, quiet: bool = False) -> Toolbox:
        return cls(
            secrets=load_secrets(config.mcp_secrets_file),
            connect_timeout_s=config.mcp_connect_timeout_s,
            retry_s=config.mcp_retry_s,
            quiet=quiet,
        )

    # -- connections ---------------------------------------------------------------------------

    def _values(self, server: McpServer, tenant: str) -> dict[str, str] | None:
        """The secrets the server is given for the tenant ("": none in particular); None when
        a per-tenant server has none for it."""
        entry = self.secrets.get(server.name, {})
        values = dict(entry.get(EVERY_TENANT, {}))
        if server.per_tenant:
            if tenant and tenant in entry:
                values.update(entry[tenant])
            elif EVERY_TENANT not in entry:
                return None
        return values

    def connection(self, server: McpServer, tenant: str = "") -> Connection | None:
        """The connection a tenant's runs use (None: a per-tenant server with no secrets for
        it, which is said once)."""
        tenant = tenant if server.per_tenant else ""
        values = self._values(server, tenant)
        if values is None:
            if not tenant:  # listing without a tenant (`turnstile jobs`, warming): said there
                return None
            self._say(f"MCP server {server.name!r} is per tenant and the secrets file has no "
                      f"entry for tenant {tenant or '(none)'!r} nor '*': it offers no tools",
                      server=server.name)  # fmt: skip
            return None
        key = (*_identity(server), tenant)
        with self._lock:
            found = self._connections.get(key)
            if found is None:
                from turnstile.worker.mcp._loop import Loop  # noqa: PLC0415 - loads `mcp`
                from turnstile.worker.mcp._session import Connection  # noqa: PLC0415

                if self._loop is None:
                    self._loop = Loop()
                label = f"{server.name}[{tenant}]" if tenant else server.name
                found = Connection(server, values, self._loop, label=label, logger=self.log,
                                   connect_timeout_s=server.connect_timeout_s
                                   or self.connect_timeout_s,
                                   retry_s=self.retry_s)  # fmt: skip
                self._connections[key] = found
            return found

    def close(self, wait_s: float = CLOSE_WAIT_S) -> None:
        """End every session (stdio servers are stopped), waiting up to `wait_s` for them."""
        with self._lock:
            connections = list(self._connections.values())
        ending = [f for f in (c.close() for c in connections) if f is not None]
        deadline = time.monotonic() + wait_s
        for future in ending:
            assert self._loop is not None
            with suppress(Exception):
                self._loop.wait(future, max(0.0, deadline - time.monotonic()))

    # -- a job's tools -----------------------------------------------------------------------

    def _say(self, line: str, **fields: Any) -> None:
        """A warning, once per process."""
        if line not in self._said:
            self._said.add(line)
            self.log.warning("mcp_tool_left_out", reason=line, **fields)

    def offered(
        self, job: Job, server: McpServer, connection: Connection, listing: Listing,
        taken: Mapping[str, Tool],
    ) -> tuple[list[Tool], list[str]]:  # fmt: skip
        """The server's tools the job offers, and one line per tool left out (or allow-listed
        and not listed). `taken`: the names other tools have already."""
        if listing.tools is None:  # never listed: nothing to offer, nothing to say yet
            return [], []
        definitions = {str(d.get("name")): d for d in listing.tools}
        kept, problems = selected(server, list(definitions))
        tools: list[Tool] = []
        for remote in kept:
            definition = definitions[remote]
            fn = _tool_fn(connection, remote, mutates=not reads(definition))
            try:
                made = make_tool(server, definition, fn)
            except JobDefinitionError as exc:
                problems.append(f"{exc}: left out")
                continue
            if made.name in taken or any(t.name == made.name for t in tools):
                problems.append(
                    f"MCP tool {made.name!r} of server {server.name!r} has the name of another "
                    f"tool of job {job.name!r}: left out"
                )
                continue
            tools.append(made)
        return tools, problems

    def job(self, job: Job, tenant: str = "") -> Job:
        """The job with its MCP tools for this tenant's runs (the job itself when it declares
        no server). Python tools win a clash of names."""
        if not job.mcp:
            return job
        found = [(s, self.connection(s, tenant)) for s in job.mcp]
        listings = [(s, c, c.listing()) for s, c in found if c is not None]
        versions = tuple(listing.version for _, _, listing in listings)
        key = (id(job), tenant if any(s.per_tenant for s in job.mcp) else "")
        with self._lock:
            cached = self._jobs.get(key)
        if cached is not None and cached[0] == versions:
            return cached[1]
        tools = dict(job.tools)
        for server, connection, listing in listings:
            made, problems = self.offered(job, server, connection, listing, tools)
            tools.update((t.name, t) for t in made)
            for line in problems:
                self._say(line, job=job.name, server=server.name)
        merged = dataclasses.replace(job, tools=tools)
        with self._lock:
            self._jobs[key] = (versions, merged)
        return merged

    def describe(self, job: Job) -> list[dict[str, Any]]:
        """Each server of the job as `turnstile jobs NAME` shows it: its tools as a model is
        offered them, or why it offers none, and the tools left out."""
        rows, taken = [], dict(job.tools)
        for server in job.mcp:
            row: dict[str, Any] = {"server": server.name, "transport": server.transport,
                                   "where": server.where, "per_tenant": server.per_tenant,
                                   "tools": [], "left_out": []}  # fmt: skip
            connection = self.connection(server)
            if connection is None:
                rows.append({**row, "status": "per_tenant",
                             "error": "listed per tenant, when a run needs it"})  # fmt: skip
                continue
            listing = connection.listing(wait=True)
            tools, problems = self.offered(job, server, connection, listing, taken)
            taken.update((t.name, t) for t in tools)
            row.update(status="ok" if listing.error is None else "unavailable",
                       error=listing.error, tools=[describe_tool(t) for t in tools],
                       left_out=problems)  # fmt: skip
            rows.append(row)
        return rows

    def warm(self, jobs: Iterable[Job]) -> None:
        """Connect every job's servers and list their tools, saying what is wrong once (a
        worker process does this when it starts, so its first step does not wait)."""
        for job in jobs:
            if job.mcp:
                self.job(job)
