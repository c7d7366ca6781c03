"""The worker's Lua scripts: one loader for all of them, and one way to call them by sha.

Every script the worker runs in the store is a file in `lua/` beside this module (the run
store's, fair share's, retention's, the HTTP API's rate limit and stream cap, the demo shop's),
so what runs inside the server is in one place, and a script is named, never a path. A script
that calls a library gets the library's text in front of its own: the ledger's `lib.lua`
(`LEDGER`: `ledger_reserve`, `ledger_settle`; the ledger keeps its own Lua, as it imports
nothing of the worker), fair share's `fair_lib.lua` (`FAIR`: `fair_queue`) or the run store's
`run_lib.lua` (`RUN`: `run_load_at`, which needs `LEDGER` before it). A file is read
once per process; registering a script computes its sha and does no I/O.

Called on its own, a registered script loads itself on NOSCRIPT (redis-py does that). In a
pipeline it is called by its sha (`evalsha`, inside `with_scripts`): the one place that loads
the scripts a server lost (a restart, a failover, SCRIPT FLUSH: on a cluster, a replica
promoted after its primary failed) and runs the pipeline again. On a cluster the pipeline is
redis-py's ClusterPipeline, which sends each command to the node of its keys' slot, and
SCRIPT LOAD goes to every primary.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import cache
from pathlib import Path
from typing import Any, NamedTuple, overload

import redis
import redis.asyncio as aioredis
from redis.commands.core import AsyncScript, Script

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


def evalsha(pipe: Any, script: Script, keys: Sequence[Any], args: Sequence[Any]) -> None:
    """Add a call of `script` by its sha to `pipe`: a command like any other, so a cluster's
    pipeline (which refuses its own `evalsha`) sends it to the node of its keys' slot."""
    pipe.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)


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
    for attempt in range(2):
        pipe = client.pipeline(transaction=False)
        build(pipe)
        try:
            replies = list(pipe.execute(raise_on_error=raise_on_error))
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
