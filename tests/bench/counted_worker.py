"""`celery worker`, with every client round trip to one server counted.

A round trip is one `send_packed_command` on a connection to the counted port: a command, a
pipeline or a script call each count once, as the client experiences them. Those made by the
job's tools (on the process's tool threads) are counted apart: they are the job's work; so are
those of the sweeper and the dispatcher, the main process's threads. (`INFO
commandstats` on the server would also count the commands run inside scripts, so it is not
the measure.) Each pool process (a green worker: its main process) writes its counts to a file
when it shuts down.

Usage:
    BENCH_COUNT_PORT=<port> BENCH_COUNT_DIR=<dir> python -m tests.bench.counted_worker <args>
"""

from __future__ import annotations

import os
import sys

from turnstile.worker.runtime.pools import patch_if_green

# `-P gevent`: monkeypatch first, as `turnstile worker` does, before socket or threading load.
GREEN = patch_if_green(sys.argv[1:], dict(os.environ))

import cProfile  # noqa: E402
import gc  # noqa: E402
import itertools  # noqa: E402
import json  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import redis.connection  # noqa: E402
from celery import signals  # noqa: E402
from celery.__main__ import main as celery_main  # noqa: E402

from turnstile.worker.observability import metrics  # noqa: E402

PORT = int(os.environ.get("BENCH_COUNT_PORT", "0"))
# BENCH_PROFILE_DIR: each pool process (a green worker: its main process) runs under cProfile
# and writes `<pid>.prof` there when it shuts down (bench_worker --profile).
PROFILE_DIR = os.environ.get("BENCH_PROFILE_DIR")
# Timed on the thread's CPU clock: waits on sockets and locks cost nothing, as in the CPU per turn.
profiler = cProfile.Profile(time.thread_time) if PROFILE_DIR else None
OUT = Path(os.environ.get("BENCH_COUNT_DIR", "."))
counts = {"round_trips": 0, "tool_round_trips": 0, "background_round_trips": 0, "tasks": 0}
# (monotonic time, +1 a task starts / -1 one ends, seconds the main thread had run or waited for
# a core so far) in this pool process: where slots stood free while the process sat idle (the
# green pool's stall, issue 36), told apart from a machine too loaded to run it.
slots: list[tuple[float, int, float]] = []
SCHEDSTAT = Path("/proc/thread-self/schedstat")


def _busy_s() -> float:
    """Seconds this thread has run on a core, plus waited for one (Linux schedstat): a gap
    in which this grows little is one in which the process sat idle."""
    try:
        ran, waited = SCHEDSTAT.read_text().split()[:2]
    except (OSError, ValueError):
        return 0.0
    return (int(ran) + int(waited)) / 1e9


gaps: dict[str, list[float]] = {"eager": [], "queued": []}  # seconds from a commit to the next turn
# The main process's own threads: on prefork their calls are in no pool process's counts; a
# green worker runs its turns in the main process, and counts them apart there.
BACKGROUND = ("turnstile-sweeper", "turnstile-dispatcher")

if os.environ.get("BENCH_KOMBU_POLLER"):  # bench_worker --kombu-poller: the stall, as it was
    from kombu.transport.redis import MultiChannelPoller

    from turnstile.worker.broker import transport

    _init = transport.Transport.__init__

    def _kombu_poller(self: Any, *args: Any, **kwargs: Any) -> None:
        _init(self, *args, **kwargs)
        self.cycle = MultiChannelPoller()

    transport.Transport.__init__ = _kombu_poller  # type: ignore[method-assign]

_send: Any = redis.connection.AbstractConnection.send_packed_command


def _counted(self: Any, command: Any, check_health: bool = True) -> None:
    if getattr(self, "port", None) == PORT:
        # A job's tools may keep state in the same server (the support job's shop does): their
        # calls are the job's work, not the step's, and are counted apart. Tools run on the
        # process's tool threads.
        name = threading.current_thread().name
        if name.startswith("turnstile-tool"):
            counts["tool_round_trips"] += 1
        elif name in BACKGROUND:
            counts["background_round_trips"] += 1
        else:
            counts["round_trips"] += 1
            if DETAIL:
                key = _what(command)
                detail[key] = detail.get(key, 0) + 1
    _send(self, command, check_health)


# BENCH_COUNT_DETAIL=1: the step's round trips by what they sent (a pipeline's commands, a
# script's name from its first line), in the counts' file as "detail".
DETAIL = bool(os.environ.get("BENCH_COUNT_DETAIL"))
detail: dict[str, int] = {}
_scripts: dict[bytes, str] = {}


def _what(command: Any) -> str:
    parts = command if isinstance(command, list) else [command]
    raw = b"".join(p if isinstance(p, bytes) else bytes(p) for p in parts)
    names = []
    for frame in raw.split(b"\r\n*")[:8]:
        lines = frame.split(b"\r\n")
        word = lines[2].decode(errors="replace").lower() if len(lines) > 2 else "?"
        if word in ("evalsha", "eval") and len(lines) > 4:
            word += ":" + _script(lines[4])
        names.append(word)
    return "+".join(names)


def _script(sha: bytes) -> str:
    return _scripts.get(sha, sha[:8].decode(errors="replace"))


if DETAIL:
    import hashlib

    from turnstile.worker.store import scripts as _store_scripts

    _source = _store_scripts.source

    def _named_source(name: str, *libraries: str) -> str:
        text = _source(name, *libraries)
        _scripts[hashlib.sha1(text.encode(), usedforsecurity=False).hexdigest().encode()] = name
        return text

    _store_scripts.source = _named_source  # type: ignore[assignment]


redis.connection.AbstractConnection.send_packed_command = _counted  # type: ignore[method-assign]

_turn_gap = metrics.turn_gap


def _gap(seconds: float, *, eager: bool) -> None:
    gaps["eager" if eager else "queued"].append(seconds)
    _turn_gap(seconds, eager=eager)


metrics.turn_gap = _gap


# The garbage collector's passes in this process, by generation: how many, and the seconds
# they took (gc.callbacks), written with the counts as "gc".
gc_passes: dict[str, list[float]] = {}
_gc_started = [0.0]


def _gc_watch(phase: str, info: dict[str, int]) -> None:
    if phase == "start":
        _gc_started[0] = time.thread_time()
        return
    passes = gc_passes.setdefault(str(info["generation"]), [0, 0.0])
    passes[0] += 1
    passes[1] += time.thread_time() - _gc_started[0]


gc.callbacks.append(_gc_watch)


@signals.worker_process_init.connect
def _reset(**kwargs: Any) -> None:
    counts.update(
        round_trips=0, tool_round_trips=0, background_round_trips=0, tasks=0
    )  # what the parent counted before the fork is not ours
    gaps["eager"].clear()
    gaps["queued"].clear()
    slots.clear()
    gc_passes.clear()
    if profiler is not None:
        profiler.enable()


@signals.task_prerun.connect
def _task_start(**kwargs: Any) -> None:
    slots.append((time.monotonic(), 1, _busy_s()))


@signals.task_postrun.connect
def _task_done(**kwargs: Any) -> None:
    counts["tasks"] += 1
    slots.append((time.monotonic(), -1, _busy_s()))


@signals.worker_ready.connect
def _profile_green(**kwargs: Any) -> None:
    if GREEN and profiler is not None:
        profiler.enable()


@signals.worker_process_shutdown.connect
def _write(**kwargs: Any) -> None:
    if profiler is not None and PROFILE_DIR:
        profiler.disable()
        profiler.dump_stats(str(Path(PROFILE_DIR) / f"{os.getpid()}.prof"))
    (OUT / f"{os.getpid()}.json").write_text(
        json.dumps(
            {
                **counts,
                "detail": detail,
                "gaps": gaps,
                "gc": gc_passes,
                "idle_with_free_slots_s": idle_with_free_slots(),
                "idle_split": idle_split(),
            }
        )
    )


def idle_with_free_slots() -> float:
    """The longest time, before this process's last task started, in which a slot stood free,
    no task started or ended, and the process neither ran nor waited for a core: with the work
    all queued first, a slot free that long is a consumer not reading the queue (a process
    descheduled on a loaded machine, or busy with one long turn, is not idle)."""
    concurrency = int(os.environ.get("TURNSTILE_CONCURRENCY", "1")) if GREEN else 1
    last_start = max((t for t, d, _ in slots if d > 0), default=0.0)
    longest, in_flight = 0.0, 0
    for (t, d, busy), (t_next, _, busy_next) in itertools.pairwise(slots):
        in_flight += d
        if t_next <= last_start and in_flight < concurrency:
            longest = max(longest, (t_next - t) - (busy_next - busy))
    return longest


def idle_split() -> dict[str, float]:
    """Over the window from this process's first task start to its last end: its length, the
    mean tasks in flight, and the seconds the process sat idle (neither ran nor waited for a
    core) with a slot free and with every slot taken."""
    concurrency = int(os.environ.get("TURNSTILE_CONCURRENCY", "1")) if GREEN else 1
    free = full = weighted = 0.0
    in_flight = 0
    for (t, d, busy), (t_next, _, busy_next) in itertools.pairwise(slots):
        in_flight += d
        idle = max(0.0, (t_next - t) - (busy_next - busy))
        weighted += in_flight * (t_next - t)
        if in_flight < concurrency:
            free += idle
        else:
            full += idle
    span = slots[-1][0] - slots[0][0] if slots else 0.0
    return {
        "span_s": span,
        "mean_in_flight": weighted / max(1e-9, span),
        "idle_free_s": free,
        "idle_full_s": full,
    }


@signals.worker_shutdown.connect
def _write_green(**kwargs: Any) -> None:
    if GREEN:  # no pool processes: the turns ran here
        _write()
    elif PROFILE_DIR:  # prefork: the main process's own, `main-<pid>-<thread>.prof`
        for name, prof in main_profilers.items():
            prof.create_stats()
            prof.dump_stats(str(Path(PROFILE_DIR) / f"main-{os.getpid()}-{name}.prof"))


# BENCH_PROFILE_DIR on prefork: the main process is profiled too (Celery's consumer on its main
# thread from the worker being ready, the dispatcher and the sweeper on theirs), each thread on
# its own profiler, written when the worker shuts down.
main_profilers: dict[str, cProfile.Profile] = {}

if PROFILE_DIR and not GREEN:
    _thread_run = threading.Thread.run

    def _profiled_run(self: threading.Thread) -> None:
        if self.name not in BACKGROUND:
            _thread_run(self)
            return
        prof = main_profilers[self.name] = cProfile.Profile(time.thread_time)
        prof.enable()
        try:
            _thread_run(self)
        finally:
            prof.disable()

    threading.Thread.run = _profiled_run  # type: ignore[method-assign]

    @signals.worker_ready.connect
    def _profile_consumer(**kwargs: Any) -> None:
        prof = main_profilers["consumer"] = cProfile.Profile(time.thread_time)
        prof.enable()


if __name__ == "__main__":
    sys.argv = ["celery", *sys.argv[1:]]
    sys.exit(celery_main())
