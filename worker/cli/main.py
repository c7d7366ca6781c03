"""The `turnstile` command line: thin commands over library functions."""

from __future__ import annotations

import json
import os
import re
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from turnstile.ledger.cli import hand_on, ledger_app, use_dimensions
from turnstile.worker.cli.common import (
    BrokerUrl,
    JsonFlag,
    OneLineGroup,
    RedisUrl,
    client,
    console_for_tables,
    fail,
    register,
)
from turnstile.worker.cli.deadletters import dead_letters_app
from turnstile.worker.cli.decisions import COMMANDS as DECISIONS
from turnstile.worker.cli.http import register as register_http
from turnstile.worker.cli.queues import COMMANDS as QUEUES
from turnstile.worker.cli.runs import COMMANDS as RUNS
from turnstile.worker.cli.tenants import HANDED_ON, tenants_app
from turnstile.worker.settings import Settings

if TYPE_CHECKING:
    from turnstile.worker.client._client import Client

app = typer.Typer(
    name="turnstile",
    cls=OneLineGroup,  # every error of every command is one line
    help="Run long LLM agent tasks as durable background steps.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.add_typer(ledger_app, name="ledger")
app.add_typer(dead_letters_app, name="dead-letters")
app.add_typer(tenants_app, name="tenants")


def _job_dimensions() -> tuple[str, ...]:
    from turnstile.worker.registry import Registry

    return Registry(None).dimensions()


register(app, QUEUES + DECISIONS + RUNS)  # the operator commands, in this order
register_http(app)


@app.callback()
def _root() -> None:
    """Turnstile: durable agent runs on Celery with a shared per-tenant budget ledger."""
    use_dimensions(_job_dimensions)  # `ledger set acme refund_cents=...`: jobs' own dimensions
    hand_on(
        HANDED_ON
    )  # `ledger set acme turns_in_flight=20`: a cap, kept by worker/scheduling/fair.py


@app.command()
def scenarios(as_json: JsonFlag = False) -> None:
    """Run the support job's scenarios A-H in this process, on a simulated clock, and print
    the table."""
    from turnstile.jobs.errors import UnknownJobError
    from turnstile.jobs.support.scenarios import BY_LETTER, table
    from turnstile.worker.registry import Registry

    try:
        Registry(None).get("support")  # the scenarios are the support job's, as registered
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


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
WORKER_NAME = re.compile(r"^[A-Za-z0-9_.%-]{1,100}(@[A-Za-z0-9_.%-]{1,200})?$")


def node_name(name: str | None) -> str:
    """The worker's Celery node name: `name@host` (`name` may carry its own `@host`), or by
    default `turnstile-<pid>@<host>`, so two workers on one machine are two nodes."""
    if not name:
        return f"turnstile-{os.getpid()}@%h"
    if not WORKER_NAME.match(name):
        fail(f"bad worker name {name!r}: letters, digits, '.', '_', '-', one '@' at most", code=2)
    return name if "@" in name else f"{name}@%h"


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
            "--concurrency",
            "-c",
            envvar="TURNSTILE_CONCURRENCY",
            help="Turns in flight: pool processes (prefork) or greenlets (gevent, hundreds).",
        ),
    ] = 2,
    pool: Annotated[
        str,
        typer.Option(
            "--pool",
            "-P",
            envvar="TURNSTILE_POOL",
            help="prefork (a process per turn, for CPU-bound tools) or gevent (hundreds of "
            "waiting turns in one process).",
        ),
    ] = "prefork",
    name: Annotated[
        str | None,
        typer.Option(
            "--name",
            "-n",
            envvar="TURNSTILE_WORKER_NAME",
            show_default=False,
            help="Node name (NAME or NAME@HOST); turnstile-<pid>@<host> by default.",
        ),
    ] = None,
    loglevel: Annotated[
        str, typer.Option("--loglevel", envvar="TURNSTILE_CELERY_LOG_LEVEL")
    ] = "WARNING",
    redis_url: RedisUrl = None,
    broker_url: BrokerUrl = None,
    reload: Annotated[
        bool,
        typer.Option(
            "--reload",
            envvar="TURNSTILE_WORKER_RELOAD",
            help="Development only: restart the worker when a job's module changes (its "
            "files are looked at twice a second), so an edited job runs without a rebuild.",
        ),
    ] = False,
) -> None:
    """Start a Celery worker for Turnstile's steps: acks late, prefetch 1, JSON only; Celery's
    task events off unless TURNSTILE_TASK_EVENTS=1. SIGTERM finishes the turns in flight before
    exiting; the exit status is Celery's, so a supervisor restarts a worker that stopped on an
    error."""
    from turnstile.worker.client._client import QUEUE_NAME

    if not redis_url:
        fail("no store: set TURNSTILE_REDIS_URL or pass --redis-url", code=2)
    names = [q.strip() for q in queues.split(",")]
    if not all(QUEUE_NAME.match(q) for q in names):
        fail(f"bad --queues {queues!r}: comma-separated names of letters, digits, '.', '_', '-'",
             code=2)  # fmt: skip
    from turnstile.worker.registry import Registry
    from turnstile.worker.runtime import pools

    problem = pools.check(pool, concurrency, lambda: Registry(None).names())
    if problem is not None:
        fail(problem, code=2)
    if pool == pools.Pool.GEVENT and not pools.green():
        fail("--pool gevent: start the worker as `turnstile worker`, which patches first", code=2)
    if loglevel.upper() not in LOG_LEVELS:
        fail(f"bad --loglevel {loglevel!r}: one of {', '.join(LOG_LEVELS)}", code=2)
    node = node_name(name)
    if reload:  # the same command, without --reload, as a child this process restarts
        child = ["worker", "-Q", ",".join(names), "-c", str(concurrency), "-P", pool,
                 "--loglevel", loglevel, *(["-n", name] if name else [])]  # fmt: skip
        raise typer.Exit(_supervise(child, redis_url, broker_url))
    config = worker_settings(redis_url, broker_url, pool, concurrency)
    _check_durable(config)
    from turnstile.worker.runtime.app import build_worker

    worker = build_worker(config)
    events = ["-E"] if config.task_events else []  # Celery's task events: see settings
    code: int | None = worker.app.start(
        ["worker", "-Q", ",".join(names), "-c", str(concurrency), "-P", pool, "-n", node,
         *events, "-l", loglevel.upper(), "--without-gossip", "--without-mingle"]
    )  # fmt: skip
    raise typer.Exit(code or worker.announced_exitcode())


def _supervise(child: list[str], redis_url: str, broker_url: str | None) -> int:
    """`turnstile worker --reload`: run the worker as a child, restarted on a job's change."""
    from turnstile.worker.dev.reload import supervise

    env = {**os.environ, "TURNSTILE_REDIS_URL": redis_url}
    env |= {"TURNSTILE_BROKER_URL": broker_url} if broker_url else {}
    return supervise(child, env)


def _check_durable(config: Settings) -> None:
    """A durable mode the store cannot keep refuses the worker before Celery starts, so the
    refusal is the only line (the worker's DurabilityHook checks again, for a worker Celery
    starts itself)."""
    from turnstile.worker.store.connect import connect
    from turnstile.worker.store.durability import DurabilityRefusedError, check_server

    store = connect(str(config.redis_url), config)
    try:
        check_server(store, config.wait_for)
    except DurabilityRefusedError as exc:
        fail(str(exc), code=2)
    finally:
        store.close()


def worker_settings(
    redis_url: str, broker_url: str | None, pool: str, concurrency: int
) -> Settings:
    """The worker's Settings: its flags, and every other setting from its `TURNSTILE_*`
    variable; a bad one is one line and exit 2."""
    from pydantic import ValidationError

    try:
        return Settings(redis_url=redis_url, broker_url=broker_url or None, pool=pool,
                        concurrency=concurrency)  # fmt: skip
    except ValidationError as exc:
        first = exc.errors()[0]
        where = "TURNSTILE_" + str(first["loc"][0]).upper() if first["loc"] else "settings"
        fail(f"bad {where}: {first['msg']}", code=2)


@app.command()
def jobs(
    name: Annotated[str | None, typer.Argument(help="One job: its params and tools.")] = None,
    as_json: JsonFlag = False,
) -> None:
    """List the jobs this process can see (entry points `turnstile.jobs` and TURNSTILE_JOBS),
    with their params schema and tools; a plugin that failed is shown as broken, with why."""
    from turnstile.worker.registry import Registry

    rows = Registry(None).describe()
    if name is not None:
        rows = [r for r in rows if r["name"] == name]
        if not rows:
            known = ", ".join(sorted(r["name"] for r in Registry(None).describe() if r["name"]))
            fail(f"unknown job {name!r}; known jobs: {known or 'none'}")
    if as_json:
        typer.echo(json.dumps(rows if name is None else rows[0]))
        return
    Console().print(_jobs_table(rows) if name is None else _job_detail(rows[0]))


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


PARAM_HELP = (
    "KEY=VALUE, repeatable. VALUE is read as JSON when it parses (1001 is a number, true a "
    "bool, '[1,2]' a list, '\"1001\"' text) and as text otherwise (acct_1); a param the "
    'job\'s schema declares as a string is always text (order_id=1001 is "1001").'
)


def _text_params(c: Client, job: str) -> set[str]:
    """The params the job declares as strings: their values are never read as JSON."""
    from turnstile.jobs.errors import KernelError

    try:
        schema = c.jobs.get(job).params_schema
    except KernelError:
        return set()  # an unknown job: the submission refuses it, naming the known ones
    props = schema.get("properties") or {}
    return {k for k, sub in props.items() if isinstance(sub, dict) and sub.get("type") == "string"}


def _params(pairs: list[str], text: set[str] | frozenset[str] = frozenset()) -> dict[str, object]:
    out: dict[str, object] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            fail(f"expected KEY=VALUE, got {pair!r}", code=2)
        if key in text:
            out[key] = value
            continue
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
        typer.Option("--param", envvar="TURNSTILE_PARAMS", help=PARAM_HELP),
    ] = None,
    queue: Annotated[str, typer.Option("--queue", envvar="TURNSTILE_QUEUE")] = "default",
    run_id: Annotated[
        str | None,
        typer.Option("--run-id", envvar="TURNSTILE_RUN_ID", help="The run's (global) id."),
    ] = None,
    idempotency_key: Annotated[
        str | None,
        typer.Option(
            "--idempotency-key",
            envvar="TURNSTILE_IDEMPOTENCY_KEY",
            show_default=False,
            help="A key of the tenant's own: the run it names is the one the HTTP API's "
            "Idempotency-Key (or run_id) names for the tenant.",
        ),
    ] = None,
    as_json: JsonFlag = False,
    redis_url: RedisUrl = None,
    broker_url: BrokerUrl = None,
) -> None:
    """Submit a run; prints its id. Idempotent with --run-id or --idempotency-key. A broker
    that is down does not refuse it: the run is stored and its step sent when the broker is
    back."""
    _params(param or [])  # a malformed pair is refused before connecting
    with client(redis_url, broker_url) as c:
        params = _params(param or [], _text_params(c, job))
        made = c.submit_run(
            tenant, user, job, goal, params, queue=queue, run_id=run_id,
            idempotency_key=idempotency_key,
        )  # fmt: skip
    deferred = made.created and not made.sent
    if as_json:
        typer.echo(json.dumps({"run_id": made.run_id, "created": made.created, "sent": made.sent}))
    else:
        typer.echo(made.run_id)
    if deferred:
        typer.echo(
            f"accepted run {made.run_id}; the step will be sent when the broker is back", err=True
        )


memory_app = typer.Typer(
    help="Long-term memory: notes kept per tenant and user, across runs.", no_args_is_help=True
)
app.add_typer(memory_app, name="memory")

MemoryTenant = Annotated[
    str, typer.Option("--tenant", envvar="TURNSTILE_TENANT", help="Whose users' notes.")
]
MemorySource = Annotated[
    str | None, typer.Option("--source", envvar="TURNSTILE_MEMORY_SOURCE", show_default=False)
]


@memory_app.command("add")
def memory_add(
    tenant: MemoryTenant,
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
    """Remember a note for a tenant's user; a note from an untrusted source is refused."""
    with client(redis_url) as c:
        said = c.remember(tenant, user, text, source=source, ttl_s=ttl_s)
    if said != "stored":
        fail(said)
    typer.echo(said)


@memory_app.command("forget")
def memory_forget(
    tenant: MemoryTenant,
    user: Annotated[str | None, typer.Option("--user", envvar="TURNSTILE_USER")] = None,
    source: MemorySource = None,
    as_json: JsonFlag = False,
    redis_url: RedisUrl = None,
) -> None:
    """Delete a tenant's notes by user, by source, or both."""
    if user is None and source is None:
        fail("say whose notes to forget: --user, --source, or both", code=2)
    with client(redis_url) as c:
        gone = c.forget(tenant, user=user, source=source)
    typer.echo(json.dumps({"forgotten": gone}) if as_json else f"forgot {gone} notes")


@memory_app.command("list")
def memory_list(
    tenant: MemoryTenant,
    user: Annotated[
        str | None, typer.Option("--user", envvar="TURNSTILE_USER", show_default=False)
    ] = None,
    as_json: JsonFlag = False,
    redis_url: RedisUrl = None,
) -> None:
    """A tenant's live notes: one user's with --user, every user's without."""
    import msgspec

    with client(redis_url) as c:
        notes = c.notes(tenant, user=user)
    if as_json:
        typer.echo(json.dumps(msgspec.to_builtins(notes)))
        return
    out = Table("user", "source", "expires (UTC)", "text")
    for note in notes:
        expires = datetime.fromtimestamp(note.expires_s, UTC).isoformat(timespec="seconds")
        out.add_row(escape(note.user_id), note.source, expires, escape(note.text))
    console_for_tables().print(out)


def main() -> None:
    app()
