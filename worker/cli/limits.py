"""`turnstile limits set|unset|show`: a provider's rate limits per model endpoint, shared by
every worker (worker/scheduling/ratelimits.py). Not the ledger: requests and tokens per minute
of a provider are not a tenant's spend, and a step waits for them instead of ending."""

from __future__ import annotations

import dataclasses
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from turnstile.worker.cli.common import (
    Connection,
    JsonFlag,
    console_for_tables,
    echo_json,
    with_store_connection,
)

limits_app = typer.Typer(
    help="A provider's rate limits per model endpoint (requests and tokens per minute), shared "
    "by every worker: a turn over them waits, holding no worker, until its bucket refills.",
    no_args_is_help=True,
)

Endpoint = Annotated[
    str,
    typer.Argument(help="The model endpoint: a model string, e.g. openai:gpt-4.1-mini.",
                   show_default=False),
]  # fmt: skip
Pairs = Annotated[
    list[str],
    typer.Argument(help="rpm=N (requests per minute), tpm=N (tokens per minute), N >= 1; "
                        "burst_s=S: S seconds' worth of them may go at once (0-30, default 1), "
                        "and no 60 s passes more than N.",
                   show_default=False),
]  # fmt: skip
Names = Annotated[
    list[str] | None,
    typer.Argument(help="rpm, tpm (default: both).", show_default=False),
]
LimitTenant = Annotated[
    str | None,
    typer.Option("--tenant", help="A tenant's own share of the endpoint, within its limits.",
                 show_default=False),
]  # fmt: skip


def _whose(endpoint: str, tenant: str | None) -> str:
    return f"{endpoint} (tenant {tenant})" if tenant else endpoint


@limits_app.command("set")
@with_store_connection
def set_(conn: Connection, endpoint: Endpoint, pairs: Pairs, tenant: LimitTenant = None) -> None:
    """Set an endpoint's limits (or a tenant's share of it); checked before anything is
    written. Workers apply them within 2 s."""
    from turnstile.worker.scheduling import ratelimits

    limits = ratelimits.parse_limits(pairs)
    providers = conn.client.config.providers
    ratelimits.set_limits(conn.client.client, endpoint, limits, tenant, providers=providers)
    shown = " ".join(f"{k}={v}" for k, v in limits.items())
    typer.echo(f"limits of {_whose(endpoint, tenant)}: {shown}")


@limits_app.command("unset")
@with_store_connection
def unset(
    conn: Connection, endpoint: Endpoint, names: Names = None, tenant: LimitTenant = None
) -> None:
    """Remove an endpoint's limits (or a tenant's share of it): all, or those named."""
    from turnstile.worker.scheduling import ratelimits

    providers = conn.client.config.providers
    removed = ratelimits.unset_limits(
        conn.client.client, endpoint, names or (), tenant, providers=providers
    )
    what = " and ".join(removed) if removed else "nothing (no such limit was set)"
    typer.echo(f"limits of {_whose(endpoint, tenant)}: removed {what}")


@limits_app.command("show")
@with_store_connection
def show(
    conn: Connection,
    endpoint: Annotated[str | None, typer.Argument(help="One endpoint; default all.")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Every limit set, with its bucket now: its burst, the requests and tokens that may go
    now (0 while turns deferred on it wait), a 429's wait still to run, deferred turns."""
    from turnstile.worker.scheduling import ratelimits

    views = ratelimits.show_limits(
        conn.client.client, endpoint, providers=conn.client.config.providers
    )
    if as_json:
        echo_json([dataclasses.asdict(v) for v in views])
        return
    table = Table("endpoint", "tenant", "rpm", "tpm", "burst (s)", "requests left",
                  "tokens left", "blocked (s)", "deferred")  # fmt: skip
    for v in views:
        table.add_row(
            escape(v.endpoint), escape(v.tenant or "-"), _n(v.rpm), _n(v.tpm), str(v.burst_s),
            _n(v.requests_left), _n(v.tokens_left), f"{v.blocked_for_s:.1f}", str(v.deferred),
        )  # fmt: skip
    console_for_tables().print(table)


def _n(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"
