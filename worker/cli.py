"""The `turnstile` command line: thin commands over library functions."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from ledger.cli import ledger_app
from worker.cli_common import BrokerUrl, JsonFlag, RedisUrl, client, fail
from worker.cli_http import register as register_http
from worker.cli_ops import register as register_ops

app = typer.Typer(
    name="turnstile",
    help="Run long LLM agent tasks as durable background steps.",
    no_args_is_help=True,
    add_completion=False,
)
app.add_typer(ledger_app, name="ledger")
register_ops(app)
register_http(app)


@app.callback()
def _root() -> None:
    """Turnstile: durable agent runs on Celery with a shared per-tenant budget ledger."""


@app.command()
def scenarios(as_json: JsonFlag = False) -> None:
    """Run spec 000's scenarios A-H in this process, on a simulated clock, and print the table."""
    from jobs.support.scenarios import BY_LETTER, table

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


@app.command()
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
) -> None:
    """Run support runs end to end: a private server (unless TURNSTILE_REDIS_URL names one),
    two worker processes, scenarios A-H and runs over a tenant's cap."""
    from worker.demo import run_demo
    from worker.errors import TurnstileError

    try:
        result = run_demo(extra_runs=runs, as_json=as_json, redis_url=redis_url)
    except TurnstileError as exc:
        fail(str(exc))
    if as_json:
        typer.echo(json.dumps(result))


@app.command()
def worker(
    queues: Annotated[
        str,
        typer.Option(
            "--queues", "-Q", envvar="TURNSTILE_QUEUES", help="Comma-separated queues to consume."
        ),
    ] = "default",
    concurrency: Annotated[
        int,
        typer.Option(
            "--concurrency", "-c", envvar="TURNSTILE_CONCURRENCY", min=1, help="Worker processes."
        ),
    ] = 2,
    loglevel: Annotated[
        str, typer.Option("--loglevel", envvar="TURNSTILE_CELERY_LOG_LEVEL")
    ] = "WARNING",
    redis_url: RedisUrl = None,
    broker_url: BrokerUrl = None,
) -> None:
    """Start a Celery worker for Turnstile's steps: acks late, prefetch 1, JSON only, events on.
    SIGTERM finishes the turns in flight before exiting."""
    import os

    if not redis_url:
        fail("no store: set TURNSTILE_REDIS_URL or pass --redis-url", code=2)
    os.environ["TURNSTILE_REDIS_URL"] = redis_url
    if broker_url:
        os.environ["TURNSTILE_BROKER_URL"] = broker_url
    from worker.app import app as celery_app
    from worker.settings import settings

    settings.cache_clear()
    celery_app.conf.update(broker_url=broker_url or redis_url)
    celery_app.worker_main(
        ["worker", "-Q", queues, "-c", str(concurrency), "-E", "-l", loglevel,
         "--without-gossip", "--without-mingle"]
    )  # fmt: skip


def _params(pairs: list[str]) -> dict[str, object]:
    out: dict[str, object] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            fail(f"expected KEY=VALUE, got {pair!r}", code=2)
        try:
            out[key] = json.loads(value)
        except ValueError:
            out[key] = value  # plain text is a string
    return out


@app.command()
def submit(
    tenant: Annotated[str, typer.Option("--tenant", envvar="TURNSTILE_TENANT")],
    user: Annotated[str, typer.Option("--user", envvar="TURNSTILE_USER")],
    goal: Annotated[str, typer.Option("--goal", envvar="TURNSTILE_GOAL")],
    job: Annotated[str, typer.Option("--job", envvar="TURNSTILE_JOB")] = "support",
    param: Annotated[
        list[str] | None,
        typer.Option(
            "--param", envvar="TURNSTILE_PARAMS", help="KEY=VALUE; VALUE is JSON or text."
        ),
    ] = None,
    queue: Annotated[str, typer.Option("--queue", envvar="TURNSTILE_QUEUE")] = "default",
    run_id: Annotated[str | None, typer.Option("--run-id", envvar="TURNSTILE_RUN_ID")] = None,
    as_json: JsonFlag = False,
    redis_url: RedisUrl = None,
    broker_url: BrokerUrl = None,
) -> None:
    """Submit a run; prints its id. Idempotent with --run-id."""
    with client(redis_url, broker_url) as c:
        made = c.submit(tenant, user, job, goal, _params(param or []), queue=queue, run_id=run_id)
    typer.echo(json.dumps({"run_id": made}) if as_json else made)


memory_app = typer.Typer(
    help="Long-term memory: notes kept per user, across runs.", no_args_is_help=True
)
app.add_typer(memory_app, name="memory")


@memory_app.command("add")
def memory_add(
    user: Annotated[str, typer.Option("--user", envvar="TURNSTILE_USER")],
    text: Annotated[str, typer.Option("--text", envvar="TURNSTILE_MEMORY_TEXT")],
    source: Annotated[
        str,
        typer.Option(
            "--source",
            envvar="TURNSTILE_MEMORY_SOURCE",
            help="user_message or validated_tool; others are refused.",
        ),
    ] = "user_message",
    ttl_s: Annotated[float, typer.Option("--ttl-s", envvar="TURNSTILE_MEMORY_TTL_S", min=1)] = 90
    * 86400,
    redis_url: RedisUrl = None,
) -> None:
    """Remember a note for a user; a note from an untrusted source is refused."""
    with client(redis_url) as c:
        said = c.remember(user, text, source=source, ttl_s=ttl_s)
    if said != "stored":
        fail(said)
    typer.echo(said)


@memory_app.command("forget")
def memory_forget(
    user: Annotated[str | None, typer.Option("--user", envvar="TURNSTILE_USER")] = None,
    source: Annotated[
        str | None, typer.Option("--source", envvar="TURNSTILE_MEMORY_SOURCE")
    ] = None,
    as_json: JsonFlag = False,
    redis_url: RedisUrl = None,
) -> None:
    """Delete notes by user, by source, or both."""
    if user is None and source is None:
        fail("say whose notes to forget: --user, --source, or both", code=2)
    with client(redis_url) as c:
        gone = c.forget(user=user, source=source)
    typer.echo(json.dumps({"forgotten": gone}) if as_json else f"forgot {gone} notes")


def main() -> None:
    app()
