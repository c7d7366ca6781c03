"""Benchmark: the client's CPU for one script call by its sha, redis-py's `Script` (its command
path: the pool's checkout with its deprecation check and observability hooks, the HIMPORT
check, the packer's scan of every argument, the hooks again) against `scripts.call_script`,
side by side in one process on a pool of the worker's kind (BlockingConnectionPool), in
interleaved batches, so a noisy machine skews both alike.

    uv run python -m tests.bench.bench_script_call [--calls 500] [--rounds 30]

The call is a turn's commit in its shape (24 keys, its arguments as one MessagePack value of a
support turn's size, tests/bench/bench_commit_args.py) to a script that returns at once, so
what is measured is the client's side; CPU is the thread's, so the server's share and the
waits on it are left out. Prints the median and the fastest batch, in microseconds a call.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

from tests.bench.bench_commit_args import turn_commit_args
from turnstile.worker.dev.embedded import EmbeddedServer
from turnstile.worker.store.connect import connect_with_timeout
from turnstile.worker.store.run_calls import packed
from turnstile.worker.store.scripts import ScriptCall, call_script


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=500, help="calls per batch")
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    keys = [f"turnstile:{{t}}:k{i}" for i in range(24)]
    call = packed(ScriptCall(keys, turn_commit_args()))
    with EmbeddedServer() as server:
        client = connect_with_timeout(server.url, 5.0, max_connections=4)
        script = client.register_script("return {KEYS[1], #ARGV}")

        def redis_py() -> Any:
            return script(keys=call.keys, args=call.args)

        def lean() -> Any:
            return call_script(client, script, call.keys, call.args)

        assert redis_py() == lean()
        ways: dict[str, Callable[[], Any]] = {"redis-py Script": redis_py, "call_script": lean}
        timings: dict[str, list[float]] = {name: [] for name in ways}
        for _ in range(args.rounds):
            for name, fn in ways.items():
                started = time.thread_time()
                for _ in range(args.calls):
                    fn()
                timings[name].append(1e6 * (time.thread_time() - started) / args.calls)
        client.close()
    base = statistics.median(timings["redis-py Script"])
    for name, per_call in timings.items():
        median = statistics.median(per_call)
        print(f"{name:>16}: median {median:6.1f} us a call, fastest batch {min(per_call):6.1f} us"
              f" ({median / base:.2f} of redis-py's)")  # fmt: skip


if __name__ == "__main__":
    main()
