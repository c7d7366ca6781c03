"""`turnstile scenarios | demo | dev-server`: the support job's scenarios on a simulated
clock, a job's runs end to end on a private server, and a store for development
(worker/dev/)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from turnstile.worker.cli.common import JsonFlag, RedisUrl, fail
from turnstile.worker.dev.devserver import DEFAULT_DIR, DEFAULT_PORT


def scenarios(as_json: JsonFlag = False) -> None:
    """Run the support job's scenarios A-H in this process, on a simulated clock, and print
    the table."""
    from turnstile.jobs.errors import UnknownJobError
    from turnstile.jobs.support.scenarios import BY_LETTER, table
    from turnstile.worker.registry import Registry
    from turnstile.worker.settings import Settings

    try:  # the scenarios are the support job's, as registered
        Registry.from_settings(Settings()).get("support")
    except UnknownJobError as exc:
        fail(str(exc))
    rows = table()
    if as_json:
        typer.echo(json.dumps(rows))
        return
    out = Table("scenario", "outcome", "detail", "steps", "tools", "tokens", "secs", "effects")
    for row in rows:
        out.add_row(
            f"{row['scenario']} {BY_LETTER[row['scenario']].title}",
            row["outcome"],
            row["detail"] or "",
            str(row["steps"]),
            str(row["tool_calls"]),
            str(row["tokens"]),
            f"{row['elapsed_s']:.1f}",
            json.dumps(row["effects"]),
        )
    Console().print(out)


def demo(
    runs: Annotated[
        int,
        typer.Option(
            "--runs",
            envvar="TURNSTILE_DEMO_RUNS",
            min=0,
            max=500,
            help="Runs for the capped tenant, besides scenarios A-H.",
        ),
    ] = 8,
    as_json: JsonFlag = False,
    redis_url: RedisUrl = None,
    job: Annotated[
        str, typer.Option("--job", envvar="TURNSTILE_DEMO_JOB", help="The job whose runs to show.")
    ] = "support",
    model: Annotated[
        str | None,
        typer.Option(
            "--model",
            envvar="TURNSTILE_DEMO_MODEL",
            help="A real model, provider:model (openai:gpt-4.1-mini, anthropic:claude-sonnet-4-6),"
            " instead of the scripted stand-in; its SDK reads OPENAI_*/ANTHROPIC_* variables.",
        ),
    ] = None,
) -> None:
    """Run a job's runs end to end: a private server (unless TURNSTILE_REDIS_URL names one),
    two worker processes, and, for support, scenarios A-H and runs over a tenant's cap; for
    another job, the example runs it declares."""
    from turnstile.worker.dev.demo import run_demo

    # An error of ours is one line through OneLineGroup, as in every command.
    result = run_demo(extra_runs=runs, as_json=as_json, redis_url=redis_url, job=job, model=model)
    if as_json:
        typer.echo(json.dumps(result))


def dev_server(
    port: Annotated[
        int,
        typer.Option(
            "--port",
            envvar="TURNSTILE_DEV_SERVER_PORT",
            min=1,
            max=65535,
            help="The port on 127.0.0.1 to listen on.",
        ),
    ] = DEFAULT_PORT,
    data_dir: Annotated[
        Path,
        typer.Option(
            "--dir",
            envvar="TURNSTILE_DEV_SERVER_DIR",
            file_okay=False,
            help="The folder its data is kept in (made if missing).",
        ),
    ] = DEFAULT_DIR,
) -> None:
    """Run a store for development in the foreground until Ctrl-C: the embedded Valkey on
    127.0.0.1, its data kept in a folder across restarts; prints the
    `export TURNSTILE_REDIS_URL=...` line for the shells that run workers and commands."""
    from turnstile.worker.dev.devserver import serve

    serve(port, data_dir, typer.echo)  # an error (the port is taken) is one line


COMMANDS = (scenarios, demo, dev_server)
