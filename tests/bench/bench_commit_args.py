"""Benchmark: the client's CPU to pack one turn's commit call (run_commit.lua), its ~70
arguments sent one by one as before against one MessagePack array (run_calls.packed), side by
side in one process: redis-py's own packing of the command, as a pipeline or a call sends it.

    uv run python -m tests.bench.bench_commit_args [--calls 20000] [--rounds 5]

The arguments are a support turn's, in their sizes and kinds: the state (about 3 KB of
JSON), one turn event (about 1 KB), two settlements of a few ledger pairs each, the fields a
turn clears, the follow-up and conversation arguments, the next step's entry and an eager
claim's arguments.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

from redis.connection import Connection

from turnstile.worker.store.run_calls import packed
from turnstile.worker.store.scripts import ScriptCall


def turn_commit_args() -> list[Any]:
    state = json.dumps({"messages": ["x" * 200] * 12, "usage": {"steps": 3, "tokens": 1234}})
    event = json.dumps({"type": "turn", "spans": [{"id": "t3", "attrs": {"m": "y" * 100}}] * 6})
    settlement = ["run-1:3:2", "1000", "tokens", "812", "tool_calls", "1", "cost_microusd", "42"]
    claim = ["tenant", 15000, "q|123|host", "abc.def", 2000, 60000, "q", "", 30000]
    return [
        "run-1", 3, state, "running", "", "", "", 15000, 10000, 1, event,
        2, len(settlement), *settlement, len(settlement), *settlement,
        3, "hold", "drawn", "followups_at", "-", "", "1000", 0, "", "", 60000, "",
        json.dumps({"v": 4, "run": "run-1"}), "slot-1", *claim,
    ]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    conn: Any = Connection()  # type: ignore[no-untyped-call]  # never connects: only packs
    keys = [f"turnstile:{{t}}:k{i}" for i in range(24)]
    call = ScriptCall(keys, turn_commit_args())

    def each() -> None:
        conn.pack_command("EVALSHA", "0" * 40, len(call.keys), *call.keys, *call.args)

    def one() -> None:
        one_call = packed(call)
        conn.pack_command("EVALSHA", "0" * 40, len(one_call.keys), *one_call.keys, *one_call.args)

    timings: dict[str, list[float]] = {"each": [], "packed": []}
    for _ in range(args.rounds):
        for name, fn in (("each", each), ("packed", one)):
            started = time.process_time()
            for _ in range(args.calls):
                fn()
            timings[name].append((time.process_time() - started) / args.calls * 1e6)
    each_us, packed_us = (statistics.median(timings[n]) for n in ("each", "packed"))
    print(f"{len(call.args)} arguments: one by one {each_us:.1f} us per call, as one MessagePack "
          f"array {packed_us:.1f} us ({packed_us / each_us:.2f}x; per round: "
          + ", ".join(f"{p / e:.2f}" for e, p in zip(timings["each"], timings["packed"],
                                                       strict=True)) + ")")  # fmt: skip


if __name__ == "__main__":
    main()
