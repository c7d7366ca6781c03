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


VERSIONS = "versions"  # `turnstile jobs versions`: the job versions in flight, not a job


def jobs(
    name: Annotated[
        str | None, typer.Argument(help="One job: its params and tools; or `versions`.")
    ] = None,
    as_json: JsonFlag = False,
    drain_job: Annotated[
        str | None,
        typer.Option("--job", help="With `versions --wait`: the job to drain a version of."),
    ] = None,
    version: Annotated[
        str | None, typer.Option(help="With `versions --wait`: the version to drain.")
    ] = None,
    wait: Annotated[
        bool, typer.Option(help="With `versions`: wait until --job's --version has no run.")
    ] = False,
    timeout_s: Annotated[
        float | None, typer.Option(help="With `versions --wait`: give up after this long.")
    ] = None,
) -> None:
    """List the jobs this process can see (entry points `turnstile.jobs` and TURNSTILE_JOBS),
    with their params schema and tools; a plugin that failed is shown as broken, with why,
    and the command then exits 1. With NAME, that job; a broken one is one line saying why.
    For one job with MCP servers, connect to them (within TURNSTILE_MCP_CONNECT_TIMEOUT_S) and
    show the tools they offer, the ones left out and why, or why a server offers none.

    `turnstile jobs versions`: every job version in the store (TURNSTILE_REDIS_URL) with its
    live runs (running, suspended, parked, waiting for a worker of that version) and the
    workers serving it; with `--job J --version V --wait`, wait until that version has no
    live run (a drain: exit 1, in one line, past --timeout-s)."""
    from turnstile.jobs.errors import UnknownJobError
    from turnstile.worker.registry import Registry
    from turnstile.worker.settings import Settings

    if name == VERSIONS:
        _versions(as_json, drain_job, version, wait=wait, timeout_s=timeout_s)
        return
    if drain_job or version or wait or timeout_s is not None:
        fail("--job, --version, --wait and --timeout-s go with `turnstile jobs versions`", 2)
    registry = Registry.from_settings(Settings())
    if name is not None:
        try:
            job = registry.get(name)  # broken or unknown: why, in one line, with the known jobs
        except UnknownJobError as exc:
            fail(str(exc))
        (row,) = [r for r in registry.describe() if r["name"] == name and r["status"] == "ok"]
        if job.mcp:
            row["mcp"] = _mcp(job)
        if as_json:
            typer.echo(json.dumps(row))
            return
        Console().print(_job_detail(row))
        for line in _mcp_lines(row.get("mcp") or []):
            typer.echo(line)
        return
    rows = registry.describe()
    if as_json:
        typer.echo(json.dumps(rows))
    else:
        Console().print(_jobs_table(rows))
    broken = [p.name or p.source for p in registry.broken()]
    if broken:
        fail(f"{len(broken)} job plugin(s) broken, each with why above: {', '.join(broken)}")


def _versions(
    as_json: bool, job: str | None, version: str | None, *, wait: bool, timeout_s: float | None
) -> None:
    import dataclasses

    from turnstile.errors import TurnstileError
    from turnstile.worker.client._client import connect_client
    from turnstile.worker.ops import versions
    from turnstile.worker.settings import Settings

    if (job is None) != (version is None) or (timeout_s is not None and not wait):
        fail("give --job and --version together; --timeout-s goes with --wait", 2)
    if wait and job is None:
        fail("--wait drains one version: give --job and --version", 2)
    try:
        with connect_client(Settings()) as c:
            if wait and job is not None and version is not None:
                versions.wait_drained(c, job, version, timeout_s=timeout_s)
                typer.echo(f"drained: job {job} version {version} has no live run")
                return
            views = versions.versions(c)
    except TurnstileError as exc:
        fail(str(exc))
    if job is not None:
        views = [v for v in views if v.job == job and v.version == version]
    if as_json:
        typer.echo(json.dumps([{**dataclasses.asdict(v), "in_flight": v.in_flight}
                               for v in views]))  # fmt: skip
        return
    out = Table("job", "version", "running", "suspended", "parked", "waiting", "workers")
    for v in views:
        out.add_row(v.job, v.version, str(v.running), str(v.suspended), str(v.parked),
                    str(v.waiting), ", ".join(v.workers) or "none")  # fmt: skip
    Console().print(out)


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
    out = Table("job", "status", "version", "tools", "dimensions", "from")
    for row in rows:
        ok = row["status"] == "ok"
        tools = ", ".join(t["name"] for t in row["tools"]) if ok else str(row["error"])  # type: ignore[attr-defined]
        dims = ", ".join(row["dimensions"]) if ok else ""  # type: ignore[arg-type]
        version = str(row["version"]) if ok else ""
        out.add_row(str(row["name"] or "?"), str(row["status"]), version, tools, dims,
                    str(row["source"]))  # fmt: skip
    return out


def _job_detail(row: dict[str, object]) -> Table:
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
