"""Ledger throughput: reserve+settle pairs per second against a trivial one-key script.

    uv run python -m tests.bench.bench_ledger [--pairs N] [--rounds R]

Starts its own server with AOF (as in production) unless TURNSTILE_TEST_REDIS_URL names one.
Three workloads run in the same run from the same clients, alternating round by round, one
client and then 4 processes on one shared tenant:

- trivial: a "pair" is two EVALSHA calls of `INCR KEYS[1]`, the same number of round trips as
  a reserve and a settle, so ledger/trivial prices everything the ledger adds (the goal: 0.8);
- floor: two scripts that issue the same Redis commands as a reserve and a settle, with the
  same KEYS and ARGV, but with constant values and no logic: what those commands cost alone;
- ledger: Ledger.reserve then Ledger.settle, four dimensions, always admitted.

Each ratio is the median over rounds of the ratio within a round, so a noisy machine moves
both sides of it together.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from turnstile.ledger import Ledger
from turnstile.ledger.client import connect
from turnstile.ledger.inputs import flat_pairs, in_dimension_order
from turnstile.ledger.keys import tenant_keys
from turnstile.worker.dev.embedded import EmbeddedServer

PROCESSES = 4
AMOUNTS = {"steps": 1, "tool_calls": 3, "tokens": 64_000, "cost_microusd": 280_000}
ACTUAL = {"steps": 1, "tool_calls": 2, "tokens": 41_250, "cost_microusd": 176_000}
CEILING = 2**52  # never reached: the benchmark measures admitted pairs

TRIVIAL = "return redis.call('INCR', KEYS[1])"

# The commands of reserve.lua and settle.lua on the common path, with constant values.
FLOOR_RESERVE = """
local t = redis.call('TIME')
redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', '(' .. t[1], 'LIMIT', 0, 16)
redis.call('HGET', KEYS[3], 'r:' .. ARGV[1])
redis.call('HMGET', KEYS[1], ARGV[5], ARGV[7], ARGV[9], ARGV[11])
redis.call('HMGET', KEYS[2], 'c:steps:all', 'r:steps:all', 'c:tool_calls:all',
  'r:tool_calls:all', 'c:tokens:all', 'r:tokens:all', 'c:cost_microusd:all',
  'r:cost_microusd:all', 'indexed')
redis.call('HSET', KEYS[2], 'r:steps:all', '1', 'r:tool_calls:all', '3', 'r:tokens:all',
  '64000', 'r:cost_microusd:all', '280000')
redis.call('HSET', KEYS[3], 'r:' .. ARGV[1], 'P|1|1||steps:all:1,tool_calls:all:3,'
  .. 'tokens:all:64000,cost_microusd:all:280000|')
redis.call('ZADD', KEYS[4], t[1], ARGV[1])
redis.call('XADD', KEYS[6], 'MAXLEN', '~', 100000, '*', 'op', 'reserve', 'id', ARGV[1],
  'at_ms', t[1], 'changes', 'steps@all:0:1;tool_calls@all:0:3;tokens@all:0:64000;'
  .. 'cost_microusd@all:0:280000', 'deadline_ms', t[1])
return { 'admitted', 1, 0, {}, 0 }
"""
FLOOR_SETTLE = """
local t = redis.call('TIME')
redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', '(' .. t[1], 'LIMIT', 0, 16)
redis.call('HGET', KEYS[3], 'r:' .. ARGV[1])
redis.call('HMGET', KEYS[2], 'c:steps:all', 'r:steps:all', 'c:tool_calls:all',
  'r:tool_calls:all', 'c:tokens:all', 'r:tokens:all', 'c:cost_microusd:all',
  'r:cost_microusd:all')
redis.call('HSET', KEYS[2], 'c:steps:all', '1', 'r:steps:all', '0', 'c:tool_calls:all', '2',
  'r:tool_calls:all', '0', 'c:tokens:all', '41250', 'r:tokens:all', '0', 'c:cost_microusd:all',
  '176000', 'r:cost_microusd:all', '0')
redis.call('ZREM', KEYS[4], ARGV[1])
redis.call('HSET', KEYS[3], 'r:' .. ARGV[1], 'S|1|1||steps:all:1,tool_calls:all:3,'
  .. 'tokens:all:64000,cost_microusd:all:280000|steps:all:1')
redis.call('ZADD', KEYS[5], t[1], 'r:' .. ARGV[1])
redis.call('XADD', KEYS[6], 'MAXLEN', '~', 100000, '*', 'op', 'settle', 'id', ARGV[1],
  'at_ms', t[1], 'changes', 'steps@all:1:-1;tool_calls@all:2:-3;tokens@all:41250:-64000;'
  .. 'cost_microusd@all:176000:-280000')
return { 'settled', 0, {}, 0 }
"""

WORKLOADS = ("trivial", "floor", "ledger")


def _ordered(amounts: dict[str, int]) -> list[tuple[str, int]]:
    return [(d, amounts[d]) for d in in_dimension_order(amounts)]


def run_pairs(url: str, workload: str, name: str, pairs: int) -> float:
    """Seconds for `pairs` pairs of one workload on one fresh client, after a warm-up pair."""
    tag = uuid.uuid4().hex[:8]
    if workload == "ledger":
        with Ledger.from_url(url, timeout_s=10) as ledger:

            def pair(i: int) -> None:
                held = ledger.reserve(name, f"{tag}:{i}", AMOUNTS, timeout_s=60)
                assert held.admitted, held
                ledger.settle(name, f"{tag}:{i}", ACTUAL)

            return _timed(pair, pairs)
    client = connect(url, timeout_s=10)
    try:
        if workload == "trivial":
            trivial = client.register_script(TRIVIAL)

            def pair(i: int) -> None:
                trivial(keys=[name])
                trivial(keys=[name])

            return _timed(pair, pairs)
        reserve, settle = (
            client.register_script(FLOOR_RESERVE),
            client.register_script(FLOOR_SETTLE),
        )
        keys = tenant_keys(name)
        reserve_args = ["60000", "60000", "100000", *flat_pairs(_ordered(AMOUNTS))]
        settle_args = ["100000", *flat_pairs(_ordered(ACTUAL))]

        def pair(i: int) -> None:
            reserve(keys=keys, args=[f"{tag}:{i}", *reserve_args])
            settle(keys=keys, args=[f"{tag}:{i}", *settle_args])

        return _timed(pair, pairs)
    finally:
        client.close()


def _timed(pair: Callable[[int], None], pairs: int) -> float:
    pair(-1)
    started = time.perf_counter()
    for i in range(pairs):
        pair(i)
    return time.perf_counter() - started


@dataclass(frozen=True)
class Job:
    """One process's share of a 4-process round (a picklable callable for the pool)."""

    url: str
    workload: str
    name: str
    pairs: int

    def __call__(self, _: int) -> float:
        return run_pairs(self.url, self.workload, self.name, self.pairs)


def in_processes(job: Job) -> float:
    """Pairs per second of PROCESSES processes running `job` at once."""
    with multiprocessing.get_context("fork").Pool(PROCESSES) as pool:
        pool.map(abs, range(PROCESSES))  # start the workers before the clock does
        started = time.perf_counter()
        pool.map(job, range(PROCESSES))
        elapsed = time.perf_counter() - started
    return PROCESSES * job.pairs / elapsed


def measure(url: str, pairs: int, rounds: int) -> dict[str, dict[str, list[float]]]:
    """Pairs per second of each workload in each setting, one entry per round."""
    tenant = f"bench-{uuid.uuid4().hex[:8]}"
    names = {
        "trivial": f"bench-trivial-{uuid.uuid4().hex[:8]}",
        "floor": f"bench-floor-{uuid.uuid4().hex[:8]}",
        "ledger": tenant,
    }
    with Ledger.from_url(url) as ledger:
        for dim in AMOUNTS:
            ledger.set_ceiling(tenant, dim, CEILING)
    rates: dict[str, dict[str, list[float]]] = {
        "1 client": {w: [] for w in WORKLOADS},
        f"{PROCESSES} processes": {w: [] for w in WORKLOADS},
    }
    for _ in range(rounds):
        for workload in WORKLOADS:
            seconds = run_pairs(url, workload, names[workload], pairs)
            rates["1 client"][workload].append(pairs / seconds)
            job = Job(url, workload, names[workload], pairs)
            rates[f"{PROCESSES} processes"][workload].append(in_processes(job))
    return rates


def report(rates: dict[str, dict[str, list[float]]], server: str) -> str:
    lines = [
        f"server: {server}",
        "pairs/s: best round; ratios: median over rounds of the ratio within a round",
        f"{'setting':<12} {'ledger':>8} {'floor':>8} {'trivial':>8}"
        f" {'ledger/trivial':>15} {'ledger/floor':>13}",
    ]
    for setting, by in rates.items():
        pairs = list(zip(by["ledger"], by["trivial"], by["floor"], strict=True))
        vs_trivial = statistics.median(ledger / trivial for ledger, trivial, _ in pairs)
        vs_floor = statistics.median(ledger / floor for ledger, _, floor in pairs)
        lines.append(
            f"{setting:<12} {max(by['ledger']):>8,.0f} {max(by['floor']):>8,.0f}"
            f" {max(by['trivial']):>8,.0f} {vs_trivial:>15.2f} {vs_floor:>13.2f}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--pairs", type=int, default=2000, help="pairs per client per round")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    named = os.environ.get("TURNSTILE_TEST_REDIS_URL")
    if named:
        rates, info = measure(named, args.pairs, args.rounds), named
    else:
        with EmbeddedServer(appendonly=True) as server:
            rates = measure(server.url, args.pairs, args.rounds)
            info = f"embedded valkey-server, AOF fsync everysec, {os.cpu_count()} cores"
    print(report(rates, info))


if __name__ == "__main__":
    main()
