"""`turnstile api` and `turnstile keys`: the HTTP server and its API keys."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from turnstile.worker.cli.common import (
    NO_STORE,
    BrokerUrl,
    Connection,
    JsonFlag,
    RedisUrl,
    fail,
    with_store_connection,
)

keys_app = typer.Typer(
    help="API keys for the HTTP API: shown once, stored as hashes.", no_args_is_help=True
)


def api(
    host: Annotated[
        str, typer.Option("--host", envvar="TURNSTILE_API_HOST", help="Address to listen on.")
    ] = "127.0.0.1",
    port: Annotated[
        int, typer.Option("--port", envvar="TURNSTILE_API_PORT", min=0, max=65535)
    ] = 8080,
    redis_url: RedisUrl = None,
    broker_url: BrokerUrl = None,
) -> None:
    """Serve the HTTP API (OpenAPI at /openapi.json) and deliver webhooks. Stateless: run as
    many as you like behind a load balancer."""
    from turnstile.worker.http.server import build, serve
    from turnstile.worker.http.settings import ApiSettings
    from turnstile.worker.settings import Settings

    if not redis_url:
        fail(NO_STORE, code=2)
    try:
        api_settings = ApiSettings(host=host, port=port)
        app = build(Settings(redis_url=redis_url, broker_url=broker_url), api_settings)
    except ValueError as exc:
        fail(f"bad setting: {' '.join(str(exc).split())}", code=2)
    serve(app, api_settings)


@keys_app.command("create")
@with_store_connection
def keys_create(
    conn: Connection,
    tenant: Annotated[str, typer.Option("--tenant", envvar="TURNSTILE_KEY_TENANT")],
    role: Annotated[
        str,
        typer.Option(
            "--role",
            envvar="TURNSTILE_KEY_ROLE",
            help="service (its tenant only) or operator (every tenant).",
        ),
    ] = "service",
    name: Annotated[
        str | None,
        typer.Option(
            "--name",
            envvar="TURNSTILE_KEY_NAME",
            show_default=False,
            help="Recorded as who decided, for every decision made with the key.",
        ),
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Create an API key. The key is printed once and stored only as its hash."""  # fmt: skip
    from turnstile.worker.http.apikeys import Role, create

    if role not in {r.value for r in Role}:
        fail(f"unknown role {role!r}; service or operator", code=2)
    record, secret = create(conn.client.client, tenant=tenant, role=Role(role), name=name)
    if as_json:
        typer.echo(json.dumps({**record.public(), "key": secret}))
        return
    typer.echo(f"{record.id} ({record.role.value} of {record.tenant}, named {record.name})")
    typer.echo(secret)
    typer.echo("keep the key now: it is not shown again", err=True)


@keys_app.command("list")
@with_store_connection
def keys_list(
    conn: Connection,
    tenant: Annotated[
        str | None, typer.Option("--tenant", envvar="TURNSTILE_KEY_TENANT", show_default=False)
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """List API keys (never the keys themselves)."""
    from turnstile.worker.http.apikeys import listed

    records = [r.public() for r in listed(conn.client.client, tenant)]
    if as_json:
        typer.echo(json.dumps(records))
        return
    table = Table("id", "tenant", "role", "name", "created", "revoked")
    for r in records:
        table.add_row(r["id"], r["tenant"], r["role"], r["name"], r["created_at"], r["revoked_at"])
    Console().print(table)


@keys_app.command("revoke")
@with_store_connection
def keys_revoke(
    conn: Connection,
    key_id: Annotated[str, typer.Argument(help="The key's id (from `keys list`).")],
    as_json: JsonFlag = False,
) -> None:
    """Revoke an API key: every server refuses it from its next request."""
    from turnstile.worker.http.apikeys import revoke

    record = revoke(conn.client.client, key_id)
    typer.echo(json.dumps(record.public()) if as_json else f"{record.id} revoked")
