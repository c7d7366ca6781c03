"""`turnstile jobs`: the jobs this process can see, with their params schema and tools."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from turnstile.worker.cli.common import JsonFlag, fail

if TYPE_CHECKING:
    from turnstile.jobs.job import Job


def jobs(
    name: Annotated[str | None, typer.Argument(help="One job: its params and tools.")] = None,
    as_json: JsonFlag = False,
) -> None:
    """List the jobs this process can see (entry points `turnstile.jobs` and TURNSTILE_JOBS),
    with their params schema and tools; a plugin that failed is shown as broken, with why.
    For one job with MCP servers, connect to them (within TURNSTILE_MCP_CONNECT_TIMEOUT_S) and
    show the tools they offer, the ones left out and why, or why a server offers none."""
    from turnstile.worker.registry import Registry

    registry = Registry(None)
    rows = registry.describe()
    if name is not None:
        rows = [r for r in rows if r["name"] == name]
        if not rows:
            known = ", ".join(sorted(r["name"] for r in registry.describe() if r["name"]))
            fail(f"unknown job {name!r}; known jobs: {known or 'none'}")
        if rows[0]["status"] == "ok" and registry.get(name).mcp:
            rows[0]["mcp"] = _mcp(registry.get(name))
    if as_json:
        typer.echo(json.dumps(rows if name is None else rows[0]))
        return
    Console().print(_jobs_table(rows) if name is None else _job_detail(rows[0]))
    for line in _mcp_lines(rows[0].get("mcp") or [] if name is not None else []):
        typer.echo(line)


def _mcp(job: Job) -> list[dict[str, Any]]:
    from turnstile.worker.mcp.toolbox import McpConfigError, Toolbox
    from turnstile.worker.settings import Settings

    try:
        toolbox = Toolbox.from_settings(Settings(), quiet=True)  # it says what it finds
    except McpConfigError as exc:
        fail(str(exc))
    try:
        return toolbox.describe(job)
    finally:
        toolbox.close()


def _mcp_lines(servers: list[dict[str, Any]]) -> list[str]:
    """One line per MCP server, per tool it offers and per tool left out."""
    lines = []
    for server in servers:
        head = f"mcp {server['server']} ({server['transport']} {server['where']})"
        if server["status"] != "ok":
            lines.append(f"{head}: {server['status']}: {server['error']}")
            continue
        lines.append(f"{head}: {len(server['tools'])} tools")
        for t in server["tools"]:
            flags = ("write" if t["mutates"] else "read") + ("" if t["reversible"] else
                                                              ", irreversible")  # fmt: skip
            lines.append(f"  tool {t['name']}: {flags}; {t['description']} "
                         f"{json.dumps(t['schema'])}")  # fmt: skip
        lines.extend(f"  left out: {why}" for why in server["left_out"])
    return lines


def _jobs_table(rows: list[dict[str, object]]) -> Table:
    out = Table("job", "status", "tools", "dimensions", "from")
    for row in rows:
        ok = row["status"] == "ok"
        tools = ", ".join(t["name"] for t in row["tools"]) if ok else str(row["error"])  # type: ignore[attr-defined]
        dims = ", ".join(row["dimensions"]) if ok else ""  # type: ignore[arg-type]
        out.add_row(str(row["name"] or "?"), str(row["status"]), tools, dims, str(row["source"]))
    return out


def _job_detail(row: dict[str, object]) -> Table:
    if row["status"] != "ok":
        out = Table("job", "status", "error", "from")
        out.add_row(str(row["name"] or "?"), "broken", str(row["error"]), str(row["source"]))
        return out
    out = Table(
        "param", "schema", title=f"{row['name']}: {row['description']}", title_justify="left"
    )
    schema = row["params_schema"]
    assert isinstance(schema, dict)
    for key, sub in sorted(schema.get("properties", {}).items()):
        out.add_row(key, json.dumps(sub))
    for t in row["tools"]:  # type: ignore[attr-defined]
        flags = "write" if t["mutates"] else "read"
        flags += "" if t["reversible"] else ", irreversible"
        out.add_row(f"tool {t['name']}", f"{flags}; {t['description']} {json.dumps(t['schema'])}")
    return out
