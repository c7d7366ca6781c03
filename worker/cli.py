"""The `turnstile` command line: thin commands over library functions."""

from __future__ import annotations

import typer

from ledger.cli import ledger_app

app = typer.Typer(
    name="turnstile",
    help="Run long LLM agent tasks as durable background steps.",
    no_args_is_help=True,
    add_completion=False,
)
app.add_typer(ledger_app, name="ledger")


@app.callback()
def _root() -> None:
    """Turnstile: durable agent runs on Celery with a shared per-tenant budget ledger."""


def main() -> None:
    app()
