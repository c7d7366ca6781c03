"""`turnstile worker`: start a Celery worker for Turnstile's steps, its flags checked and
parsed into one Settings before Celery starts (or, with --reload, a supervisor that restarts
it on a job's change)."""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING, Annotated, Any

import typer

from turnstile.worker.cli.common import NO_STORE, BrokerUrl, RedisUrl, fail
from turnstile.worker.settings import Settings

if TYPE_CHECKING:
    from celery import Celery

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
    start_wait_s: Annotated[
        float | None,
        typer.Option(
            "--start-wait-s",
            envvar="TURNSTILE_START_WAIT_S",
            min=0,
            show_default=False,
            help="Seconds to wait at start for the store and the broker to answer before "
            "exiting non-zero with one line saying which did not (default 30).",
        ),
    ] = None,
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
    error. A store or broker that does not answer within --start-wait-s is one line and exit
    1; one lost later is ridden out (steps retry until it is back)."""
    from turnstile.errors import InvalidNameError
    from turnstile.worker.names import check_name

    if not redis_url:
        fail(NO_STORE, code=2)
    names = [q.strip() for q in queues.split(",")]
    try:
        for queue_name in names:
            check_name("queue", queue_name)
    except InvalidNameError as exc:
        fail(f"bad --queues {queues!r}: {exc}", code=2)
    from turnstile.worker.registry import Registry
    from turnstile.worker.runtime import pools

    problem = pools.check(pool, concurrency, lambda: Registry.from_settings(Settings()).names())
    if problem is not None:
        fail(problem, code=2)
    if pool == pools.Pool.GEVENT and not pools.green():
        fail("--pool gevent: start the worker as `turnstile worker`, which patches first", code=2)
    if loglevel.upper() not in LOG_LEVELS:
        fail(f"bad --loglevel {loglevel!r}: one of {', '.join(LOG_LEVELS)}", code=2)
    node = node_name(name)
    config = worker_settings(redis_url, broker_url, pool, concurrency, start_wait_s)
    if reload:  # the same command, without --reload, as a child this process restarts
        wait = [] if start_wait_s is None else ["--start-wait-s", f"{start_wait_s:g}"]
        child = ["worker", "-Q", ",".join(names), "-c", str(concurrency), "-P", pool,
                 "--loglevel", loglevel, *(["-n", name] if name else []), *wait]  # fmt: skip
        raise typer.Exit(_supervise(child, redis_url, broker_url, config.jobs))
    _check_reachable(config)
    _check_durable(config)
    from turnstile.worker.runtime.app import build_worker, worker_environment

    # This process is the worker: what a library configured only by the environment must find
    # there (prometheus_client's directory) is set here, at the edge, before Celery starts.
    os.environ.update(worker_environment(config, os.environ))
    worker = build_worker(config)
    events = ["-E"] if config.task_events else []  # Celery's task events: see settings
    code = run_celery_worker(
        worker.app,
        ["-Q", ",".join(names), "-c", str(concurrency), "-P", pool, "-n", node, *events,
         "-l", loglevel.upper(), "--without-gossip", "--without-mingle"],
    )  # fmt: skip
    raise typer.Exit(code or worker.announced_exitcode())


def run_celery_worker(app: Celery, args: list[str]) -> int | None:
    """Celery's `worker` command on `app` with `args`, parsed and run as `app.start(["worker",
    *args])` would, without Celery's whole command line: its group (celery.bin.celery) loads
    the `amqp` shell's click_repl and prompt_toolkit, for nothing a worker runs (a worker's CPU
    from exec to ready: 1.19 -> 1.00 s). The group's own work is not needed here: the app is given,
    and it sets no environment, loader or user options. Returns the command's exit status."""
    from celery.bin.base import CLIContext
    from celery.bin.worker import worker as worker_command
    from click.exceptions import Exit

    # no_color None is Celery's own default (colour on a terminal); its stub says bool only.
    obj = CLIContext(app=app, no_color=None, workdir=None)  # type: ignore[arg-type]
    try:
        code: int | None = worker_command.main(
            args=args, obj=obj, prog_name="turnstile worker", standalone_mode=False
        )
    except Exit as exc:  # as Celery.start: a command may raise it past click's own handling
        return exc.exit_code
    return code


def _supervise(child: list[str], redis_url: str, broker_url: str | None, jobs: str) -> int:
    """`turnstile worker --reload`: run the worker as a child, restarted on a change of a job
    that `jobs` (TURNSTILE_JOBS) or an entry point registers. The child's environment is this
    process's, with the flags' store and broker: this command is the edge that starts it."""
    from turnstile.worker.dev.reload import supervise

    env = {**os.environ, "TURNSTILE_REDIS_URL": redis_url}
    env |= {"TURNSTILE_BROKER_URL": broker_url} if broker_url else {}
    return supervise(child, env, jobs)


def _check_durable(config: Settings) -> None:
    """A durable mode the store cannot keep, or a store URL its server disagrees with,
    refuses the worker before Celery starts, so the refusal is the only line (the worker's
    DurabilityHook checks again, for a worker Celery starts itself)."""
    import contextlib

    from turnstile.errors import StoreMismatchError, StoreUnavailableError
    from turnstile.worker.store.connect import UNAVAILABLE, check, connect
    from turnstile.worker.store.durability import DurabilityRefusedError, check_server

    try:
        store = connect(str(config.redis_url), config)
    except StoreMismatchError as exc:  # a cluster URL naming a single server, say
        fail(str(exc), code=2)
    except StoreUnavailableError:  # down for now: the worker's steps retry until it is back
        return
    try:
        with contextlib.suppress(*UNAVAILABLE):
            check(store, str(config.redis_url), config)
        _ = config.broker  # a cluster is no broker
        check_server(store, config.wait_for)
    except (DurabilityRefusedError, StoreMismatchError) as exc:
        fail(str(exc), code=2)
    finally:
        store.close()


def _check_reachable(config: Settings) -> None:
    """A store or broker that does not answer within --start-wait-s, or refuses the worker,
    refuses it before Celery starts: one line naming it and what to do, exit 1 for one that
    did not answer (a supervisor's restart may mend it), 2 for a refusal (no restart does)."""
    from turnstile.worker.runtime.reach import wait_reachable

    found = wait_reachable(config)
    if found is not None:
        fail(found.line(config.start_wait_s), code=found.exit_code)


def worker_settings(
    redis_url: str,
    broker_url: str | None,
    pool: str,
    concurrency: int,
    start_wait_s: float | None = None,
) -> Settings:
    """The worker's Settings: its flags, and every other setting from its `TURNSTILE_*`
    variable; a bad one is one line and exit 2."""
    from pydantic import ValidationError

    flags: dict[str, Any] = {} if start_wait_s is None else {"start_wait_s": start_wait_s}
    try:
        return Settings(redis_url=redis_url, broker_url=broker_url or None, pool=pool,
                        concurrency=concurrency, **flags)  # fmt: skip
    except ValidationError as exc:
        first = exc.errors()[0]
        where = "TURNSTILE_" + str(first["loc"][0]).upper() if first["loc"] else "settings"
        fail(f"bad {where}: {first['msg']}", code=2)
