"""`turnstile dead-letters list|drop`: the queue entries workers could not take in.

They live on the broker (`--broker-url`, the store's server by default), beside the queues,
or in the store with a RabbitMQ broker; `worker.deadletters` says how they get there.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated

import redis
import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Column, Table

from turnstile.worker.cli.common import Connection, JsonFlag, fail, with_connection

dead_letters_app = typer.Typer(
    help="Queue entries a worker could not take in (not JSON, a broken envelope, an unknown "
    "task, ...), kept with the reason.",
    no_args_is_help=True,
)

Queue = Annotated[
    str | None,
    typer.Option("--queue", envvar="TURNSTILE_DEAD_LETTER_QUEUE", show_default=False,
                 help="Only this queue's dead letters."),
]  # fmt: skip
Limit = Annotated[
    int, typer.Option("--limit", envvar="TURNSTILE_LIMIT", min=1, max=10_000, help="At most.")
]
Ids = Annotated[
    list[str] | None,
    typer.Option("--id", envvar="TURNSTILE_DEAD_LETTER_IDS", show_default=False,
                 help="A dead letter's id (see `list`); repeat for more."),
]  # fmt: skip
All = Annotated[
    bool,
    typer.Option("--all", envvar="TURNSTILE_DEAD_LETTER_ALL",
                 help="Every dead letter (of --queue, if given)."),
]  # fmt: skip

RAW_SHOWN_CHARS = 60


@contextmanager
def broker(conn: Connection) -> Iterator[redis.Redis]:
    """Where the dead letters are kept: the broker's server, as the command's --broker-url
    names it (the store's by default), or the store with a RabbitMQ broker."""
    from turnstile.worker.broker import amqp

    url = conn.client.config.broker
    if amqp.is_amqp(url):
        try:
            yield conn.client.client
        except redis.RedisError as exc:
            fail(f"store unreachable: {exc}")
        return
    server = redis.Redis.from_url(url, decode_responses=True, socket_timeout=5)
    try:
        yield server
    except redis.RedisError as exc:
        fail(f"broker unreachable: {exc}")
    finally:
        server.close()


@dead_letters_app.command("list")
@with_connection
def list_(
    conn: Connection, queue: Queue = None, limit: Limit = 100, as_json: JsonFlag = False
) -> None:
    """The newest dead letters, newest first: queue, when, why, and the start of the entry."""
    from turnstile.worker.broker import deadletters

    with broker(conn) as server:
        letters = deadletters.listing(server, queue, limit)
    if as_json:
        typer.echo(json.dumps([dataclasses.asdict(d) for d in letters]))
        return
    if not letters:
        typer.echo("no dead letters")
        return
    table = Table(
        Column("id", no_wrap=True), "queue", Column("at", no_wrap=True),
        Column("reason", no_wrap=True), Column("bytes", justify="right"), "detail", "entry",
    )  # fmt: skip
    for d in letters:
        shown = d.raw[:RAW_SHOWN_CHARS] + ("…" if len(d.raw) > RAW_SHOWN_CHARS else "")
        table.add_row(
            d.id, escape(d.queue), d.at[:19], d.reason, str(d.size_bytes), escape(d.detail),
            escape(shown if d.raw_encoding == "text" else f"base64:{shown}"),
        )  # fmt: skip
    console = Console()  # piped, a table is as wide as it needs (up to 160 columns)
    (console if console.is_terminal else Console(width=max(console.width, 160))).print(table)


@dead_letters_app.command("drop")
@with_connection
def drop(
    conn: Connection,
    ids: Ids = None,
    all_: All = False,
    queue: Queue = None,
    as_json: JsonFlag = False,
) -> None:
    """Remove dead letters: the ones named by --id, or --all of them (of --queue, if given)."""
    from turnstile.worker.broker import deadletters

    if bool(ids) == all_:
        fail("say which: --id ID (repeatable) or --all", code=2)
    with broker(conn) as server:
        gone = deadletters.drop(server, queue=queue, ids=None if all_ else list(ids or []))
    typer.echo(json.dumps({"dropped": gone}) if as_json else f"dropped {gone} dead letters")
