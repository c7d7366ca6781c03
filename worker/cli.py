"""The `turnstile` command line: thin commands over library functions."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

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


JsonFlag = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]


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


def main() -> None:
    app()
