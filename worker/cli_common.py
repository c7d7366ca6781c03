"""What every `turnstile` command shares: the store options, the client, one-line errors.

Every option has an environment variable (`TURNSTILE_*`); an error is one line on stderr and
a non-zero exit, never a traceback.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, NoReturn

import redis
import typer

from jobs.errors import KernelError
from ledger.errors import LedgerError
from worker.api import Client, connect_client
from worker.errors import TurnstileError
from worker.settings import Settings

RedisUrl = Annotated[
    str | None,
    typer.Option("--redis-url", envvar="TURNSTILE_REDIS_URL", show_default=False,
                 help="URL of the store (runs and ledger)."),
]  # fmt: skip
BrokerUrl = Annotated[
    str | None,
    typer.Option("--broker-url", envvar="TURNSTILE_BROKER_URL", show_default=False,
                 help="URL of Celery's broker; the store's server by default."),
]  # fmt: skip
JsonFlag = Annotated[
    bool, typer.Option("--json", envvar="TURNSTILE_JSON", help="Print JSON instead of a table.")
]
Operator = Annotated[
    str, typer.Option("--by", envvar="TURNSTILE_OPERATOR", help="Who is deciding, for the record.")
]


def fail(message: str, code: int = 1) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


@contextmanager
def client(redis_url: str | None, broker_url: str | None = None) -> Iterator[Client]:
    """A client for the command, turning every expected error into one clear line."""
    if not redis_url:
        fail("no store: set TURNSTILE_REDIS_URL or pass --redis-url", code=2)
    try:
        made = connect_client(Settings(redis_url=redis_url, broker_url=broker_url))
    except ValueError as exc:
        fail(f"bad store URL {redis_url!r}: {exc}", code=2)
    try:
        yield made
    except (TurnstileError, KernelError, LedgerError) as exc:
        fail(str(exc))
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        fail(f"store unreachable at {redis_url}: {exc}")
