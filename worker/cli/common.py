"""What every `turnstile` command shares: the store options, the client, one-line errors.

Every option has an environment variable (`TURNSTILE_*`). An error is one line on stderr and a
non-zero exit, never a traceback: `one_line` is the single place that turns an exception
(ours, the server's, the broker client's, a usage error) into that line, and `OneLineGroup`,
the class of the `turnstile` command, applies it to every subcommand. A URL in a message never
shows its password.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Annotated, Any, NoReturn

import kombu.exceptions
import pydantic
import redis
import typer
from typer._click.core import Context  # typer vendors click: its own context and errors
from typer._click.exceptions import ClickException, NoArgsIsHelpError, UsageError
from typer._click.globals import get_current_context
from typer.core import TyperGroup

from turnstile.errors import TurnstileError
from turnstile.jobs.model import ModelError
from turnstile.ledger.cli import BROKER_URL_META, STORE_URL_META, redact
from turnstile.worker.client._client import Client, connect_client
from turnstile.worker.settings import Settings

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


def _flat(text: str) -> str:
    return redact(" ".join(str(text).split()))


# The server's errors, most specific first: what the line says before the server's words.
_STORE_ERRORS: tuple[tuple[type[redis.RedisError], str], ...] = (
    (redis.AuthenticationError, "the store{at} refused the credentials"),
    (redis.exceptions.NoPermissionError, "the store{at} refused the command for this user"),
    (redis.ReadOnlyError, "the store{at} is read-only (a replica?)"),
    (redis.BusyLoadingError, "the store{at} is loading its data; try again shortly"),
    (redis.ConnectionError, "store unreachable{at}"),
    (redis.TimeoutError, "store unreachable{at}"),
    (redis.ResponseError, "the store{at} refused"),
    (redis.RedisError, "store error{at}"),
)


def _store_line(exc: redis.RedisError, at: str) -> str:
    head = next(text for kind, text in _STORE_ERRORS if isinstance(exc, kind))
    return f"{head.format(at=at)}: {exc}"


def one_line(exc: BaseException, *, store: str | None = None, broker: str | None = None) -> str:
    """The one line a command prints for an error, naming where it came from."""
    # A model's signal is the kernel's to handle: one that gets this far is a bug, said so.
    if isinstance(exc, TurnstileError) and not isinstance(exc, ModelError):
        return _flat(str(exc))
    if isinstance(exc, redis.RedisError):
        return _flat(_store_line(exc, f" at {store}" if store else ""))
    if isinstance(exc, kombu.exceptions.KombuError):
        return _flat(f"broker error{f' at {broker}' if broker else ''}: {exc}")
    if isinstance(exc, pydantic.ValidationError):
        fields = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
        )
        return _flat(f"bad settings: {fields}")
    if isinstance(exc, OSError):
        return _flat(f"{type(exc).__name__}: {exc}")
    return _flat(f"unexpected {type(exc).__name__}: {exc}")


def fail(message: str, code: int = 1) -> NoReturn:
    typer.echo(f"error: {_flat(message)}", err=True)
    raise typer.Exit(code)


def _remember_urls(store: str | None, broker: str | None) -> None:
    ctx = get_current_context(silent=True)
    if ctx is not None:
        ctx.meta[STORE_URL_META] = store
        ctx.meta[BROKER_URL_META] = broker or store


@contextmanager
def client(redis_url: str | None, broker_url: str | None = None) -> Iterator[Client]:
    """A client for the command. Errors raised inside become one line (see OneLineGroup)."""
    if not redis_url:
        fail("no store: set TURNSTILE_REDIS_URL or pass --redis-url", code=2)
    _remember_urls(redis_url, broker_url)
    try:
        made = connect_client(Settings(redis_url=redis_url, broker_url=broker_url))
    except pydantic.ValidationError:
        raise
    except ValueError as exc:  # redis-py's word for a malformed URL
        fail(f"bad store URL {redis_url!r}: {exc}", code=2)
    with made:  # a command run in process (the tests, a script) leaves no socket open
        yield made


class OneLineGroup(TyperGroup):
    """The `turnstile` command: every error of every subcommand is one line on stderr.

    A usage error is `turnstile: <message>` (exit 2), not click's usage block; any other
    exception is `error: <message>` (exit 1) through `one_line`, never a traceback.
    """

    def invoke(self, ctx: Context) -> Any:
        try:
            return super().invoke(ctx)
        except (typer.Exit, typer.Abort, ClickException):
            raise
        except Exception as exc:
            line = one_line(exc, store=ctx.meta.get(STORE_URL_META),
                            broker=ctx.meta.get(BROKER_URL_META))  # fmt: skip
            typer.echo(f"error: {line}", err=True)
            raise typer.Exit(1) from None

    def main(  # type: ignore[override]
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        try:
            rv = super().main(args, prog_name or "turnstile", complete_var, False, **extra)
            code = rv if isinstance(rv, int) else 0
        except NoArgsIsHelpError as exc:
            exc.show()  # `turnstile` alone, or a group alone: its help
            code = exc.exit_code
        except UsageError as exc:
            hint = f" (see '{exc.ctx.command_path} --help')" if exc.ctx is not None else ""
            typer.echo(f"turnstile: {_flat(exc.format_message())}{hint}", err=True)
            code = exc.exit_code
        except ClickException as exc:
            typer.echo(f"error: {_flat(exc.format_message())}", err=True)
            code = exc.exit_code
        except typer.Abort:
            typer.echo("turnstile: aborted", err=True)
            code = 1
        if standalone_mode:
            sys.exit(code)
        return code
