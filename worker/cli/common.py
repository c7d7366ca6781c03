"""What every `turnstile` command shares: the store options, the client, one-line errors.

Every option has an environment variable (`TURNSTILE_*`). An error is one line on stderr and a
non-zero exit, never a traceback: `one_line` is the single place that turns an exception
(ours, the server's, the broker client's, a usage error) into that line, and `OneLineGroup`,
the class of the `turnstile` command, applies it to every subcommand. A URL in a message never
shows its password.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Annotated, Any, NoReturn

import kombu.exceptions
import pydantic
import redis
import typer
from rich.console import Console
from typer._click.core import Context  # typer vendors click: its own context and errors
from typer._click.exceptions import ClickException, NoArgsIsHelpError, UsageError
from typer._click.globals import get_current_context
from typer.core import TyperGroup

from turnstile.errors import TurnstileError, redact
from turnstile.jobs.model import ModelError
from turnstile.ledger.cli import BROKER_URL_META, STORE_URL_META
from turnstile.worker.client._client import Client, connect_client
from turnstile.worker.settings import Settings
from turnstile.worker.store.connect import UNAVAILABLE, check, store_line

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
# A command with no store to work on: what to set, and how to get a store on a laptop.
NO_STORE = (
    "no store: set TURNSTILE_REDIS_URL or pass --redis-url (for development, `turnstile "
    "dev-server` starts one and prints the line to set)"
)
JsonFlag = Annotated[
    bool, typer.Option("--json", envvar="TURNSTILE_JSON", help="Print JSON instead of a table.")
]


def _flat(text: str) -> str:
    return redact(" ".join(str(text).split()))


def one_line(exc: BaseException, *, store: str | None = None, broker: str | None = None) -> str:
    """The one line a command prints for an error, naming where it came from."""
    # A model's signal is the kernel's to handle: one that gets this far is a bug, said so.
    if isinstance(exc, TurnstileError) and not isinstance(exc, ModelError):
        return _flat(str(exc))
    if isinstance(exc, redis.RedisError):
        return _flat(store_line(exc, store))
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


def open_client(redis_url: str | None, broker_url: str | None = None) -> Client:
    """A client for the command. Errors raised while it is used become one line (see
    OneLineGroup)."""
    if not redis_url:
        fail(NO_STORE, code=2)
    _remember_urls(redis_url, broker_url)
    try:
        config = Settings(redis_url=redis_url, broker_url=broker_url)
        made = connect_client(config)
    except pydantic.ValidationError:
        raise
    except ValueError as exc:  # redis-py's word for a malformed URL
        fail(f"bad store URL {redis_url!r}: {exc}", code=2)
    with contextlib.suppress(*UNAVAILABLE):  # down: the command's first operation says so
        check(made.client, redis_url, config)
    return made


@contextlib.contextmanager
def client(redis_url: str | None, broker_url: str | None = None) -> Iterator[Client]:
    """`open_client` for a `with` block, closed when it ends."""
    with open_client(redis_url, broker_url) as made:
        yield made


class Connection:
    """The store a command works on, as its --redis-url and --broker-url name it. Connected on
    first use, so a command checks its own options first: a usage error is said before a
    missing store."""

    def __init__(self, redis_url: str | None, broker_url: str | None) -> None:
        self.redis_url, self.broker_url = redis_url, broker_url

    @functools.cached_property
    def client(self) -> Client:
        return open_client(self.redis_url, self.broker_url)

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        # A command run in process (the tests, a script) leaves no socket open.
        if "client" in self.__dict__:
            self.client.close()


def from_options(
    name: str, options: Sequence[tuple[str, Any]], make: Callable[..., Any], *, last: bool = False
) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """A decorator for a command whose parameter `name` stands for a group of options: the
    command as mounted takes `options` (where `name` stood, or after every other option with
    `last`) and is given make(**their values), closed when the command ends if it is a
    context manager. So a group of options is declared, and turned into what the library
    takes, once for every command that has it."""

    def mount(command: Callable[..., None]) -> Callable[..., None]:
        keyword = inspect.Parameter.KEYWORD_ONLY  # typer passes every value by name
        group = [
            inspect.Parameter(o, keyword, default=None, annotation=kind) for o, kind in options
        ]
        params: list[inspect.Parameter] = []
        for param in inspect.signature(command, eval_str=True).parameters.values():
            if param.name == name:
                params += [] if last else group
            else:
                params.append(param.replace(kind=keyword))
        params += group if last else []

        @functools.wraps(command)
        def mounted(**values: Any) -> None:
            with contextlib.ExitStack() as ending:
                made = make(**{o: values.pop(o) for o, _ in options})
                if isinstance(made, contextlib.AbstractContextManager):
                    ending.enter_context(made)  # a Connection closes when the command ends
                command(**values, **{name: made})

        mounted.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        mounted.__annotations__ = {p.name: p.annotation for p in params} | {"return": None}
        return mounted

    return mount


# --redis-url and --broker-url, last on every command, as the command's `conn`.
with_connection = from_options(
    "conn", (("redis_url", RedisUrl), ("broker_url", BrokerUrl)), Connection, last=True
)
# --redis-url alone, last, as the command's `conn`: for a command that never uses the broker.
with_store_connection = from_options(
    "conn", (("redis_url", RedisUrl),), functools.partial(Connection, broker_url=None), last=True
)


def register(app: typer.Typer, commands: Sequence[Callable[..., None]]) -> None:
    """Mount commands that take a `conn` on the main `turnstile` command, in this order."""
    for command in commands:
        app.command()(with_connection(command))


def echo_json(data: Any) -> None:
    typer.echo(json.dumps(data, default=str))


def console_for_tables() -> Console:
    """A console for tables: a piped table is as wide as it needs (up to 160 columns), not
    the 80 rich assumes without a terminal."""
    console = Console()
    return console if console.is_terminal else Console(width=max(console.width, 160))


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
