"""`celery worker`, with every client round trip to one server counted.

A round trip is one `send_packed_command` on a connection to the counted port: a command, a
pipeline or a script call each count once, as the client experiences them. Those made by the
job's tools (on the process's tool threads) are counted apart: they are the job's work. (`INFO
commandstats` on the server would also count the commands run inside scripts, so it is not
the measure.) Each pool process writes its counts to a file when it shuts down.

Usage:
    BENCH_COUNT_PORT=<port> BENCH_COUNT_DIR=<dir> python -m tests.bench.counted_worker <args>
"""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path
from typing import Any

import redis.connection
from celery import signals
from celery.__main__ import main as celery_main

PORT = int(os.environ.get("BENCH_COUNT_PORT", "0"))
OUT = Path(os.environ.get("BENCH_COUNT_DIR", "."))
counts = {"round_trips": 0, "tool_round_trips": 0, "tasks": 0}

_send: Any = redis.connection.AbstractConnection.send_packed_command


def _counted(self: Any, command: Any, check_health: bool = True) -> None:
    if getattr(self, "port", None) == PORT:
        # A job's tools may keep state in the same server (the support job's shop does): their
        # calls are the job's work, not the step's, and are counted apart. Tools run on the
        # process's tool threads.
        tool = threading.current_thread().name.startswith("turnstile-tool")
        counts["tool_round_trips" if tool else "round_trips"] += 1
    _send(self, command, check_health)


redis.connection.AbstractConnection.send_packed_command = _counted  # type: ignore[method-assign]


@signals.worker_process_init.connect
def _reset(**kwargs: Any) -> None:
    counts.update(
        round_trips=0, tool_round_trips=0, tasks=0
    )  # what the parent counted before the fork is not ours


@signals.task_postrun.connect
def _task_done(**kwargs: Any) -> None:
    counts["tasks"] += 1


@signals.worker_process_shutdown.connect
def _write(**kwargs: Any) -> None:
    (OUT / f"{os.getpid()}.json").write_text(json.dumps(counts))


if __name__ == "__main__":
    sys.argv = ["celery", *sys.argv[1:]]
    sys.exit(celery_main())
