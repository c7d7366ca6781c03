"""The `turnstile` command line: thin commands over library functions, one module per command
group; this module assembles them into the one `turnstile` command, in the order --help lists
them."""

from __future__ import annotations

import redis
import typer

from turnstile.ledger.cli import hand_on, ledger_app, use_connect, use_dimensions
from turnstile.worker.cli.common import OneLineGroup, register
from turnstile.worker.cli.deadletters import dead_letters_app
from turnstile.worker.cli.decisions import COMMANDS as DECISIONS
from turnstile.worker.cli.dev import COMMANDS as DEV
from turnstile.worker.cli.evaluate import eval_app, fork
from turnstile.worker.cli.http import api, keys_app
from turnstile.worker.cli.jobs import jobs
from turnstile.worker.cli.limits import limits_app
from turnstile.worker.cli.mcp import mcp
from turnstile.worker.cli.memory import memory_app
from turnstile.worker.cli.queues import COMMANDS as QUEUES
from turnstile.worker.cli.runs import COMMANDS as RUNS
from turnstile.worker.cli.submit import submit
from turnstile.worker.cli.tenants import HANDED_ON, tenants_app
from turnstile.worker.cli.worker import worker

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
app.add_typer(limits_app, name="limits")
app.add_typer(keys_app, name="keys")
app.add_typer(memory_app, name="memory")
app.add_typer(eval_app, name="eval")


def _job_dimensions() -> tuple[str, ...]:
    from turnstile.worker.registry import Registry
    from turnstile.worker.settings import Settings

    return Registry.from_settings(Settings()).dimensions()


def _store_client(url: str) -> redis.Redis:
    from turnstile.worker.settings import Settings
    from turnstile.worker.store.connect import connect

    return connect(url, Settings(redis_url=url))


register(app, QUEUES + DECISIONS + RUNS + (fork,))  # the operator commands, in this order
for command in (api, *DEV, worker, jobs, submit, mcp):
    app.command()(command)


@app.callback()
def _root() -> None:
    """Turnstile: durable agent runs on Celery with a shared per-tenant budget ledger."""
    use_dimensions(_job_dimensions)  # `ledger set acme refund_cents=...`: jobs' own dimensions
    use_connect(_store_client)  # `ledger show`: the store's client, as every command's
    hand_on(
        HANDED_ON
    )  # `ledger set acme turns_in_flight=20`: a cap, kept by worker/scheduling/fair.py


def main() -> None:
    app()
