"""`turnstile tenants set|show`: how much of the workers a tenant may occupy.

Not the ledger: a cap on turns in flight and a fair-share weight are not spend, have no period
and are read by the dispatcher (worker/scheduling/fair.py), not by the ledger's scripts; so they
live in their own hash per tenant and their own command, beside `turnstile ledger`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Annotated, cast

import typer
from rich.markup import escape
from rich.table import Table

from turnstile.ledger.cli import HandedOn
from turnstile.worker.cli.common import (
    Connection,
    JsonFlag,
    client,
    console_for_tables,
    with_connection,
)
from turnstile.worker.store import pending
from turnstile.worker.store import tenants as stored_tenants
from turnstile.worker.store.queues import TENANT_QUEUES, parse_tenant_queues

tenants_app = typer.Typer(
    help="A tenant's share of the workers: a cap on its turns in flight, its fair-share weight.",
    no_args_is_help=True,
)

TenantArg = Annotated[str, typer.Argument(help="The tenant (it need not have runs yet).")]
Pairs = Annotated[
    list[str],
    typer.Argument(help="turns_in_flight=N, active_runs=N (none: no cap), weight=N (default 1), "
                        "extendable=tokens,cost (budget dimensions whose running out suspends "
                        "a run needs_budget; none: none), queues=a,b (the only queues the "
                        "tenant may submit to; none: the deployment's).",
                   show_default=False),
]  # fmt: skip


@tenants_app.command("set")
@with_connection
def set_(conn: Connection, tenant: TenantArg, pairs: Pairs) -> None:
    """Set a tenant's caps (turns in flight, active runs) and weight; checked before anything
    is written. A tenant not seen yet is allowed: the settings apply from its first run."""
    from turnstile.worker.names import check_name
    from turnstile.worker.scheduling import fair

    check_name("tenant", tenant)
    extendable = [p for p in pairs if p.startswith(f"{EXTENDABLE}=")]
    own_queues = [p for p in pairs if p.startswith(f"{QUEUES}=")]
    rest = [p for p in pairs if p not in extendable and p not in own_queues]
    names = _extendable(extendable)
    queues = parse_tenant_queues(own_queues[-1].partition("=")[2]) if own_queues else None
    caps = fair.parse_caps(rest) if rest or not (extendable or own_queues) else {}
    written = {EXTENDABLE: names, QUEUES: queues}
    stored_tenants.set_settings(
        conn.client.client, tenant, {k: ",".join(v) for k, v in written.items() if v is not None}
    )
    if caps:
        fair.set_caps(conn.client.client, tenant, caps)
    shown: dict[str, int | str | None] = {**caps}
    shown |= {k: ",".join(v) or "none" for k, v in written.items() if v is not None}
    typer.echo(_shown(tenant, shown))


EXTENDABLE = "extendable"  # the budget dimensions whose running out suspends a tenant's runs
QUEUES = TENANT_QUEUES  # the queues the tenant may submit to (none: the deployment's)


def _extendable(pairs: list[str]) -> list[str] | None:
    """`extendable=tokens,cost` (`none`: none): the budget dimensions whose running out
    suspends the tenant's runs `needs_budget`; checked before anything is written."""
    from turnstile.jobs.extensions import EXTENDABLE as DIMENSIONS
    from turnstile.jobs.extensions import is_tenant
    from turnstile.worker.scheduling.fair import CapError

    if not pairs:
        return None
    raw = pairs[-1].partition("=")[2]
    names = [] if raw in ("none", "") else raw.split(",")
    unknown = [n for n in names if n not in DIMENSIONS and not is_tenant(n)]
    if unknown:
        raise CapError(
            f"extendable: {unknown[0]!r} is not a budget dimension; one of "
            + ", ".join(DIMENSIONS)
            + ", or tenant.<dimension> for a soft ceiling"
        )
    return sorted(set(names))


def _shown(tenant: str, caps: Mapping[str, int | str | None]) -> str:
    return f"tenant {tenant}: " + " ".join(
        f"{k}={'none' if v is None else v}" for k, v in caps.items()
    )


def _names() -> tuple[str, ...]:
    from turnstile.worker.scheduling import fair

    return fair.CAPS


def _check(pairs: list[str]) -> object:
    from turnstile.worker.scheduling import fair

    return fair.parse_caps(pairs)


def _write(redis_url: str, tenant: str, checked: object) -> str:
    from turnstile.worker.scheduling import fair

    caps = cast("dict[str, int | None]", checked)
    with client(redis_url, None) as c:
        fair.set_caps(c.client, tenant, caps)
    return _shown(tenant, caps)


# `turnstile ledger set acme turns_in_flight=20` sets a cap as `tenants set` does.
HANDED_ON = HandedOn(names=_names, check=_check, write=_write)


@tenants_app.command("show")
@with_connection
def show(
    conn: Connection,
    tenant: Annotated[str | None, typer.Argument(help="One tenant; default every tenant.")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Each tenant's steps waiting for the dispatcher, turns in flight, cap and weight."""
    from turnstile.worker.scheduling import fair

    c = conn.client
    names = [tenant] if tenant else stored_tenants.names(c.client)
    queues = pending.queues(c.client)
    views = [fair.tenant_view(c.client, name, queues) for name in names]
    if as_json:
        typer.echo(json.dumps([dataclasses.asdict(v) for v in views]))
        return
    table = Table("tenant", "waiting", "in flight", "cap", "active runs", "cap", "weight",
                  "queues")  # fmt: skip
    for v in views:
        table.add_row(escape(v.tenant), str(v.waiting), str(v.in_flight), _cap(v.cap),
                      str(v.active_runs), _cap(v.runs_cap), str(v.weight),
                      escape(",".join(v.queues) or "-"))  # fmt: skip

    console_for_tables().print(table)  # piped, as wide as its columns need


def _cap(cap: int | None) -> str:
    return "-" if cap is None else str(cap)
