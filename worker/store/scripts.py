"""The worker's Lua scripts: one loader for all of them, and one way to call them by sha.

Every script the worker runs in the store is a file in `lua/` beside this module (the run
store's, fair share's, retention's, the HTTP API's rate limit and stream cap, the demo shop's),
so what runs inside the server is in one place, and a script is named, never a path. A script
that calls a library gets the library's text in front of its own: the ledger's `lib.lua`
(`LEDGER`: `ledger_reserve`, `ledger_settle`; the ledger keeps its own Lua, as it imports
nothing of the worker), fair share's `fair_lib.lua` (`FAIR`: `fair_queue`) or the run store's
`run_lib.lua` (`RUN`: `run_load_at`, which needs `LEDGER` before it). A file is read
once per process; registering a script computes its sha and does no I/O.

Called on its own (`call_script`), a script is sent by its sha on a connection of the client's
pool and loads itself on NOSCRIPT, as redis-py's `Script` does, with less of redis-py's
per-command work. In a pipeline it is called by its sha (`evalsha`, inside `with_scripts`): the
one place that loads the scripts a server lost (a restart, a failover, SCRIPT FLUSH: on a
cluster, a replica promoted after its primary failed) and runs the pipeline again. On a
cluster the pipeline is
redis-py's ClusterPipeline, which sends each command to the node of its keys' slot, and
SCRIPT LOAD goes to every primary.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import cache
from pathlib import Path
from typing import Any, NamedTuple, cast, overload

import redis
import redis.asyncio as aioredis
from redis.commands.core import AsyncScript, Script
from redis.observability.providers import get_observability_instance

from turnstile.ledger.scripts import library_source

LUA = Path(__file__).parent / "lua"
LEDGER = "ledger"  # the ledger's lib.lua, for a script that reserves or settles
FAIR = "fair_lib"  # fair_queue, for a script that queues a run's next step
RUN = "run_lib"  # run_load_at, for a script that loads a run for a step (after LEDGER)
RL = "rl_lib"  # a model endpoint's token buckets, for rl_draw.lua and rl_adjust.lua


class ScriptCall(NamedTuple):
    """One script call's KEYS and ARGV, as a store module's builder makes them (pure)."""

    keys: list[str]
    args: list[Any]


@cache
def _file(name: str) -> str:
    return (LUA / f"{name}.lua").read_text(encoding="utf-8")


@cache
def source(name: str, *libraries: str) -> str:
    """The text to register for `lua/<name>.lua`: the libraries it calls, in the order given,
    then the script itself."""
    parts = [library_source() if lib == LEDGER else _file(lib) for lib in libraries]
    return "\n".join((*parts, _file(name)))


@overload
def register(client: aioredis.Redis, name: str, *libraries: str) -> AsyncScript: ...
@overload
def register(client: redis.Redis, name: str, *libraries: str) -> Script: ...
def register(
    client: redis.Redis | aioredis.Redis, name: str, *libraries: str
) -> Script | AsyncScript:
    """Script `name` with its `libraries` (see `source`), registered on `client`."""
    return client.register_script(source(name, *libraries))


def call_script(
    client: redis.Redis, script: Script, keys: Sequence[Any], args: Sequence[Any]
) -> Any:
    """The reply of `script` called with `keys` and `args`: what `script(keys=keys, args=args)`
    answers, raising what it raises, in fewer steps. redis-py's command path spends about 12 us
    of a commit's 35 us (client CPU, tests/bench/bench_script_call.py) on work a script call by
    sha does not need: the deprecation check of the pool's arguments, its observability hooks
    (which look for a collector on every command when none is set), the HIMPORT check, the
    per-argument scan of its packer. Here: a connection of the client's pool, the command
    packed once by the connection and sent with its health check, retried on the connection's
    own Retry (which disconnects it between tries, as redis-py's commands do), the connection
    given back; on NOSCRIPT the script is loaded and called once more. A cluster's client, a
    client on a single connection, or a process where redis-py's OpenTelemetry metrics are on
    (its hooks then record something) calls the script as redis-py does."""
    pool = _plain_pool(client)
    if pool is None:
        return script(keys=keys, args=args)
    try:
        return _evalsha(pool, script.sha, keys, args)
    except redis.exceptions.NoScriptError:
        script.sha = str(client.script_load(script.script))
        return _evalsha(pool, script.sha, keys, args)


def _plain_pool(client: redis.Redis) -> Any:
    """The pool of a client whose commands may skip redis-py's per-command work (see
    `call_script`), or None: a cluster's client, a client on a single connection, or a process
    where redis-py's OpenTelemetry metrics are on."""
    pool = getattr(client, "connection_pool", None)
    if (
        type(client) is not redis.Redis
        or client.connection is not None
        or get_observability_instance().is_enabled()
    ):
        return None
    return pool


def _exchange(pool: Any, pack: Callable[[Any], Any], read: Callable[[Any], Any]) -> Any:
    """On a connection of `pool`: what `pack` packs sent, and `read`'s reading of the reply;
    sent again on the connection's own Retry after a connection error (which disconnects it
    between tries, as redis-py's commands do); the connection given back."""
    conn = pool.get_connection()
    try:
        packed = pack(conn)

        def once() -> Any:
            conn.send_packed_command(packed)
            return read(conn)

        return conn.retry.call_with_retry(once, lambda _error: conn.disconnect())
    finally:
        pool.release(conn)


def _evalsha(pool: Any, sha: str, keys: Sequence[Any], args: Sequence[Any]) -> Any:
    return _exchange(
        pool,
        lambda conn: conn.pack_command("EVALSHA", sha, len(keys), *keys, *args),
        lambda conn: conn.read_response(),
    )


def evalsha(pipe: Any, script: Script, keys: Sequence[Any], args: Sequence[Any]) -> None:
    """Add a call of `script` by its sha to `pipe`: a command like any other, so a cluster's
    pipeline (which refuses its own `evalsha`) sends it to the node of its keys' slot."""
    pipe.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)


def _run_stack(
    client: redis.Redis, pool: Any, commands: list[tuple[tuple[Any, ...], dict[str, Any]]],
    raise_on_error: bool,
) -> list[Any]:  # fmt: skip
    """What `Pipeline.execute` (no transaction) answers for the commands a pipeline stacked,
    with less of redis-py's work around it (as `call_script` does for one call; the run's load,
    a pipeline of three, spent 6% of a green worker's CPU in redis-py's): the commands packed
    at once on a connection of the pool, each reply read and given redis-py's response
    callback, an error in its place; sent again after a connection error, as redis-py's
    pipeline does (`_exchange`), so its commands must bear running twice."""

    def read(conn: Any) -> list[Any]:
        replies: list[Any] = []
        for args, options in commands:
            try:
                replies.append(cast(Any, client).parse_response(conn, args[0], **options))
            except redis.exceptions.ResponseError as exc:
                replies.append(exc)
        return replies

    stacked = [args for args, _ in commands]
    replies: list[Any] = _exchange(pool, lambda conn: conn.pack_commands(stacked), read)
    if raise_on_error:
        for reply in replies:
            if isinstance(reply, redis.exceptions.ResponseError):
                raise reply
    return replies


def with_scripts(
    client: redis.Redis,
    scripts: Sequence[Script],
    build: Callable[[Any], None],
    *,
    raise_on_error: bool = True,
) -> list[Any]:
    """Run the pipeline `build` fills, which calls `scripts` by their sha: EVALSHA as is, for
    redis-py's own script support in a pipeline asks SCRIPT EXISTS first, a round trip more
    each time. A script the server lost is loaded and the pipeline built and run once more,
    so its other commands must bear running twice. With `raise_on_error=False` the replies
    hold each command's error in its place (a durability wait's, say) instead of raising the
    first one; a NOSCRIPT among them still loads the scripts and runs the pipeline again."""
    pool = _plain_pool(client)
    for attempt in range(2):
        pipe = client.pipeline(transaction=False)
        build(pipe)
        try:
            if pool is None:
                replies = list(pipe.execute(raise_on_error=raise_on_error))
            else:
                replies = _run_stack(client, pool, pipe.command_stack, raise_on_error)
        except redis.exceptions.NoScriptError:
            if attempt:
                raise
        else:
            lost = any(isinstance(r, redis.exceptions.NoScriptError) for r in replies)
            if attempt or not lost:
                return replies
        for script in scripts:
            script.sha = str(client.script_load(script.script))
    raise AssertionError("unreachable")  # pragma: no cover
