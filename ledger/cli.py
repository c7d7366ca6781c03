"""`turnstile ledger set|show`: thin commands over the Ledger API."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Annotated

import redis
import typer
from rich.console import Console
from rich.table import Table
from typer._click.globals import get_current_context  # typer vendors click

from turnstile.errors import redact
from turnstile.ledger.client import Ledger
from turnstile.ledger.errors import LedgerError
from turnstile.ledger.inputs import (
    DEFAULT_DIMENSIONS,
    Period,
    check_amount,
    check_known_dimension,
    check_tenant,
)

ledger_app = typer.Typer(
    help="Read and set a tenant's budget ceilings.",
    no_args_is_help=True,
    add_completion=False,
)

# Where a command keeps the URLs it talks to (click's context meta), so that an error raised
# anywhere in it can name the server without showing its password.
STORE_URL_META = "turnstile.store_url"
BROKER_URL_META = "turnstile.broker_url"

RedisUrl = Annotated[
    str | None,
    typer.Option(
        "--redis-url",
        envvar="TURNSTILE_REDIS_URL",
        help="URL of the ledger's Redis or Valkey server.",
        show_default=False,
    ),
]


def _fail(message: str, code: int = 1) -> typer.Exit:
    typer.echo(f"error: {redact(' '.join(message.split()))}", err=True)
    return typer.Exit(code)


_extra_dimensions: list[Callable[[], Sequence[str]]] = []


def use_dimensions(source: Callable[[], Sequence[str]]) -> None:
    """Name the dimensions beyond the built-in four that `set` accepts: the turnstile CLI
    passes its job registry's (a job's own, such as refund_cents)."""
    _extra_dimensions[:] = [source]


@dataclass(frozen=True)
class HandedOn:
    """Settings that `set` takes beside ceilings and hands to their owner, so that they can be set
    the way a ceiling is: the turnstile CLI passes a tenant's caps on its share of the workers
    (`turns_in_flight=20`), which are not spend and are not kept in the ledger. `check` takes
    the pairs and raises on a bad one (writing nothing); `write(store URL, tenant, checked)`
    writes them and returns the line to print."""

    names: Callable[[], Collection[str]]
    check: Callable[[list[str]], object]
    write: Callable[[str, str, object], str]


_handed_on: list[HandedOn] = []


def hand_on(settings: HandedOn) -> None:
    """Name the settings beyond ceilings that `set` accepts (see HandedOn)."""
    _handed_on[:] = [settings]


_connect: list[Callable[[str], redis.Redis]] = []


def use_connect(connect: Callable[[str], redis.Redis]) -> None:
    """Name how a command opens its client of the store: the turnstile CLI passes its own
    (worker/store/connect.py), so `turnstile ledger` reaches a single server or a cluster as
    every other command does. Without one, `Ledger.from_url` (the ledger on its own)."""
    _connect[:] = [connect]


@contextmanager
def _ledger(url: str | None) -> Iterator[Ledger]:
    if not url:
        raise _fail("no ledger store: set TURNSTILE_REDIS_URL or pass --redis-url", code=2)
    extra = tuple(d for source in _extra_dimensions for d in source())
    ctx = get_current_context(silent=True)
    if ctx is not None:
        ctx.meta[STORE_URL_META] = url
    try:
        dimensions = (*DEFAULT_DIMENSIONS, *extra)
        ledger = (
            Ledger(_connect[0](url), dimensions=dimensions)
            if _connect
            else Ledger.from_url(url, dimensions=dimensions)
        )
    except ValueError as exc:  # redis-py's word for a malformed URL
        raise _fail(f"bad ledger store URL {url!r}: {exc}", code=2) from None
    try:
        with ledger:
            yield ledger
    except LedgerError as exc:
        raise _fail(str(exc)) from None


def _parse_limit(text: str) -> tuple[str, int]:
    name, sep, value = text.partition("=")
    if not sep or not re.fullmatch(r"[0-9]+", value.strip()):
        raise _fail(f"expected DIMENSION=INTEGER, got {text!r}", code=2)
    return name.strip(), int(value)


@ledger_app.command("set")
def set_ceilings(
    tenant: Annotated[str, typer.Argument(help="Tenant name.")],
    limits: Annotated[
        list[str],
        typer.Argument(
            help="DIMENSION=CEILING pairs, e.g. cost_microusd=100000000; caps such as "
            "turns_in_flight=20 too."
        ),
    ],
    period: Annotated[
        Period, typer.Option("--period", help="When usage starts again from zero (UTC).")
    ] = Period.NONE,
    soft: Annotated[
        bool, typer.Option("--soft", help="Flag going past the ceiling instead of refusing.")
    ] = False,
    redis_url: RedisUrl = None,
) -> None:
    """Set ceilings for a tenant: hard unless --soft, with one period for all given. Every
    pair is checked before any is written: one bad pair and nothing changes. A tenant's caps
    on its share of the workers (turns_in_flight, active_runs, weight; NAME=none removes a
    cap) are taken too, as `turnstile tenants set` takes them: they have no period and are
    never soft."""
    other = {n for h in _handed_on for n in h.names()}
    theirs = [text for text in limits if text.partition("=")[0].strip() in other]
    ours = [text for text in limits if text.partition("=")[0].strip() not in other]
    if theirs and (soft or period is not Period.NONE):
        names = ", ".join(text.partition("=")[0].strip() for text in theirs)
        raise _fail(f"{names}: a cap on the workers has no period and is never soft; "
                    "set it without --period and --soft", code=2)  # fmt: skip
    parsed = [_parse_limit(text) for text in ours]
    checked = [(h, h.check(theirs)) for h in _handed_on] if theirs else []
    with _ledger(redis_url) as ledger:
        check_tenant(tenant)
        for name, value in parsed:
            check_known_dimension(name, ledger.dimensions)
            check_amount(f"ceiling of {name}", value)
        for name, value in parsed:
            ledger.set_ceiling(tenant, name, value, hard=not soft, period=period.value)
            kind = "soft" if soft else "hard"
            typer.echo(f"{tenant} {name}: ceiling {value} ({kind}, period {period.value})")
    for handed, settings in checked:
        typer.echo(handed.write(str(redis_url), tenant, settings))


@ledger_app.command("show")
def show(
    tenant: Annotated[str, typer.Argument(help="Tenant name.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
    redis_url: RedisUrl = None,
) -> None:
    """Show a tenant's ceilings and usage in the current period of each dimension."""
    with _ledger(redis_url) as ledger:
        state = ledger.read(tenant)
    if as_json:
        rows = {
            name: {
                "ceiling": dim.ceiling,
                "committed": dim.committed,
                "reserved": dim.reserved,
                "hard": dim.hard,
                "period": dim.period.value,
            }
            for name, dim in state.items()
        }
        typer.echo(json.dumps(rows))
        return
    if not state:
        typer.echo(f"{tenant}: no ceilings and no usage")
        return
    table = Table("dimension", "ceiling", "committed", "reserved", "available", "kind", "period")
    for name, dim in state.items():
        ceiling = "unlimited" if dim.ceiling is None else str(dim.ceiling)
        available = (
            "-" if dim.ceiling is None else str(max(0, dim.ceiling - dim.committed - dim.reserved))
        )
        period = (
            dim.period.value if dim.period is Period.NONE else f"{dim.period.value} {dim.bucket}"
        )
        kind = "hard" if dim.hard else "soft"
        table.add_row(name, ceiling, str(dim.committed), str(dim.reserved), available, kind, period)
    Console().print(table)
