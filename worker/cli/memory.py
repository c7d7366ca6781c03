"""`turnstile memory add|forget|list`: long-term notes kept per tenant and user."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from turnstile.worker.cli.common import (
    Connection,
    JsonFlag,
    console_for_tables,
    fail,
    with_store_connection,
)

memory_app = typer.Typer(
    help="Long-term memory: notes kept per tenant and user, across runs.", no_args_is_help=True
)

MemoryTenant = Annotated[
    str, typer.Option("--tenant", envvar="TURNSTILE_TENANT", help="Whose users' notes.")
]
MemorySource = Annotated[
    str | None, typer.Option("--source", envvar="TURNSTILE_MEMORY_SOURCE", show_default=False)
]


@memory_app.command("add")
@with_store_connection
def memory_add(
    conn: Connection,
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
) -> None:
    """Remember a note for a tenant's user; a note from an untrusted source is refused."""
    said = conn.client.remember(tenant, user, text, source=source, ttl_s=ttl_s)
    if said != "stored":
        fail(said)
    typer.echo(said)


@memory_app.command("forget")
@with_store_connection
def memory_forget(
    conn: Connection,
    tenant: MemoryTenant,
    user: Annotated[str | None, typer.Option("--user", envvar="TURNSTILE_USER")] = None,
    source: MemorySource = None,
    as_json: JsonFlag = False,
) -> None:
    """Delete a tenant's notes by user, by source, or both."""
    if user is None and source is None:
        fail("say whose notes to forget: --user, --source, or both", code=2)
    gone = conn.client.forget(tenant, user=user, source=source)
    typer.echo(json.dumps({"forgotten": gone}) if as_json else f"forgot {gone} notes")


@memory_app.command("list")
@with_store_connection
def memory_list(
    conn: Connection,
    tenant: MemoryTenant,
    user: Annotated[
        str | None, typer.Option("--user", envvar="TURNSTILE_USER", show_default=False)
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """A tenant's live notes: one user's with --user, every user's without."""
    import msgspec

    notes = conn.client.notes(tenant, user=user)
    if as_json:
        typer.echo(json.dumps(msgspec.to_builtins(notes)))
        return
    out = Table("user", "source", "expires (UTC)", "text")
    for note in notes:
        expires = datetime.fromtimestamp(note.expires_s, UTC).isoformat(timespec="seconds")
        out.add_row(escape(note.user_id), note.source, expires, escape(note.text))
    console_for_tables().print(out)
