"""The worker's execution pool: how many turns one worker process holds in flight, and how a
turn that ignores its timeout is still stopped.

`prefork` (Celery's default): one turn per process; the soft limit is a signal, the hard limit
kills the pool process. For CPU-bound tools.

`gevent`: hundreds of turns in one process, each a greenlet; a turn waits on its model or
tool without holding a process. Its limits: the step's soft limit is a `gevent.Timeout`
raised in the turn's greenlet at its next yield (every socket read, sleep and lock under the
monkeypatch), so the run ends `budget_exhausted`/deadline as on prefork; Celery's own hard
limit is another `gevent.Timeout`. A greenlet that never yields (a CPU loop, a C call that
blocks) blocks the hub and every other turn with it: a watchdog on a real OS thread kills
the whole process when the hub has not run for `hub_block_limit_s`; acks are late, and the
in-flight leases of its turns lapse, so the sweeper sends their steps again.

`threads` is refused: a thread can be neither interrupted nor killed, so a call that ignores
its timeout would hold its turn (and its ledger hold) for ever.

This module imports only the standard library at the top: `turnstile worker` reads the pool
from its arguments and monkeypatches before anything imports socket, ssl or threading.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from enum import StrEnum
from typing import Any


class Pool(StrEnum):
    PREFORK = "prefork"
    GEVENT = "gevent"
    THREADS = "threads"


# What each pool can stop from outside: a call that ignores its timeout.
ENFORCES_HARD_LIMITS = frozenset({Pool.PREFORK, Pool.GEVENT})
# Turns in flight in one worker process: processes for prefork (each ~70 MB), greenlets for
# gevent (each a few hundred KB while it waits).
MAX_CONCURRENCY = {Pool.PREFORK: 1024, Pool.GEVENT: 5000, Pool.THREADS: 1024}
# select.poll's default mask: POLLIN | POLLPRI | POLLOUT (gevent watches for reads and writes).
DEFAULT_POLL_MASK = 1 | 2 | 4
# Connections a green worker keeps besides one per turn: the sweeper, the heartbeat, Celery's
# consumer and event dispatcher.
SPARE_CONNECTIONS = 8


def check(pool: str, concurrency: int, jobs: Callable[[], Sequence[str]]) -> str | None:
    """Why the worker must not start with this pool and concurrency, or None. `jobs` gives
    the job names, asked for only to name them when a pool is refused for want of hard
    limits: a worker that starts builds its registry once, later, over its store."""
    names = ", ".join(p.value for p in Pool if p in ENFORCES_HARD_LIMITS)
    if pool not in Pool.__members__.values():
        return f"bad --pool {pool!r}: one of {names}"
    chosen = Pool(pool)
    if chosen not in ENFORCES_HARD_LIMITS:
        return (
            f"--pool {pool} cannot stop a call that ignores its timeout, and every job's "
            f"turns need that hard limit ({', '.join(jobs()) or 'no jobs'}): use {names}"
        )
    top = MAX_CONCURRENCY[chosen]
    if not 1 <= concurrency <= top:
        return f"bad --concurrency {concurrency}: 1 to {top} turns in flight for --pool {pool}"
    return None


def pool_in_argv(argv: Sequence[str], env: dict[str, str]) -> str:
    """The pool a `turnstile worker` command line asks for (`--pool P`, `--pool=P`, `-P P`, or
    TURNSTILE_POOL), read before anything else is imported; prefork by default."""
    if "worker" not in argv:
        return Pool.PREFORK.value
    chosen = env.get("TURNSTILE_POOL", Pool.PREFORK.value)
    for index, arg in enumerate(argv):
        if arg in ("--pool", "-P") and index + 1 < len(argv):
            chosen = argv[index + 1]
        elif arg.startswith("--pool="):
            chosen = arg.split("=", 1)[1]
    return chosen


def patch_if_green(argv: Sequence[str], env: dict[str, str]) -> bool:
    """Monkeypatch the standard library for gevent when the command is a green worker: first
    thing, before socket, ssl or threading are imported by anything else."""
    if pool_in_argv(argv, env) != Pool.GEVENT.value:
        return False
    from gevent import monkey  # noqa: PLC0415 - only a green worker loads gevent

    monkey.patch_all()
    _ready_at_once()
    return True


def _ready_at_once() -> None:
    """Make a zero-timeout `select.poll().poll(0)` the system call it is, not gevent's.

    gevent's `poll` starts a watcher per descriptor and waits on the hub even for a timeout of
    0: a trip through the hub and its loop to ask whether a socket has bytes waiting. redis-py
    asks that of a connection every time it takes one from its pool, and httpcore of a kept
    connection before reusing it: on a green worker with hundreds of turns, about a tenth of
    its CPU. A poll that cannot block needs no hub: it is asked of the kernel directly, and
    answers the descriptors' state as it is now (gevent's answered what its loop saw). Any
    other timeout waits in the hub as before."""
    import select  # noqa: PLC0415 - patched by patch_all just before

    from gevent import monkey  # noqa: PLC0415 - only a green worker loads gevent

    green: Any = select.poll
    kernel: Callable[[], Any] = monkey.get_original("select", "poll")

    class Poll(green):  # type: ignore[misc]
        """gevent's poll, whose zero-timeout poll is the kernel's."""

        def __init__(self) -> None:
            super().__init__()
            self.masks: dict[int, int] = {}

        def register(self, fd: Any, eventmask: int = DEFAULT_POLL_MASK) -> None:
            super().register(fd, eventmask)
            self.masks[fd if isinstance(fd, int) else fd.fileno()] = eventmask

        def modify(self, fd: Any, eventmask: int) -> None:
            self.register(fd, eventmask)

        def unregister(self, fd: Any) -> None:
            super().unregister(fd)
            self.masks.pop(fd if isinstance(fd, int) else fd.fileno(), None)

        def poll(self, timeout: float | None = None) -> list[tuple[int, int]]:
            if timeout is None or timeout != 0:
                result: list[tuple[int, int]] = super().poll(timeout)
                return result
            now = kernel()
            for fd, mask in self.masks.items():
                now.register(fd, mask)
            ready: list[tuple[int, int]] = now.poll(0)
            return ready

    select.poll = Poll  # type: ignore[misc]


def green() -> bool:
    """Whether this process runs on gevent's monkeypatched standard library."""
    if "gevent.monkey" not in sys.modules:
        return False
    from gevent import monkey  # noqa: PLC0415 - only a green worker loads gevent

    return bool(monkey.is_module_patched("socket"))


def soft_limit(seconds: float, exc: type[BaseException]) -> AbstractContextManager[object]:
    """Raise `exc` in the current greenlet after `seconds` (at its next yield). On prefork,
    Celery's own soft limit (a signal) does this, so here it is nothing."""
    if not green():
        return nullcontext()
    import gevent  # noqa: PLC0415 - only a green worker loads gevent

    timeout: AbstractContextManager[object] = gevent.Timeout(seconds, exc)
    return timeout


class Watchdog:
    """Kills this process when gevent's hub has not run for `limit_s`: a greenlet that blocks
    the hub would otherwise hold every turn of the process past its hard limit. The ticker is
    a greenlet; the watch is a real OS thread, which runs while the hub is blocked."""

    def __init__(self, limit_s: float, *, on_kill: Callable[[float], None] | None = None) -> None:
        self.limit_s = limit_s
        self.on_kill = on_kill
        self._last = time.monotonic()
        self._every_s = min(1.0, limit_s / 4)

    def start(self) -> None:
        import gevent  # noqa: PLC0415 - only a green worker loads gevent
        from gevent import monkey  # noqa: PLC0415 - only a green worker loads gevent

        gevent.spawn(self._tick)
        start_thread = monkey.get_original("_thread", "start_new_thread")
        start_thread(self._watch, (monkey.get_original("time", "sleep"),))

    def _tick(self) -> None:
        import gevent  # noqa: PLC0415 - only a green worker loads gevent

        while True:
            self._last = time.monotonic()
            gevent.sleep(self._every_s)

    def _watch(self, sleep: Callable[[float], None]) -> None:
        while True:
            sleep(self._every_s)
            blocked_s = time.monotonic() - self._last
            if blocked_s > self.limit_s:
                if self.on_kill is not None:
                    self.on_kill(blocked_s)
                os.kill(os.getpid(), signal.SIGKILL)
