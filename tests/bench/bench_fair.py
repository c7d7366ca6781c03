"""Benchmark: what fair share costs and what it buys, with TURNSTILE_FAIR_SHARE on and off side
by side in each round, on two worker processes of one pool process each.

    uv run python -m tests.bench.bench_fair [--runs 200] [--tenants 4] [--flood 600] [--rounds 3]

- cost: zero-latency support runs of `--tenants` tenants, submitted first; turns/s from the
  workers being ready to the last run ending, and the pool processes' round trips to the
  store per turn (the dispatcher's own, in each worker's main process, are not counted).
- starvation: with the workers running, tenant A submits `--flood` zero-latency runs and, a
  second later, tenant B submits 20; B's time from submit to first turn (p50/p95) and how many
  of A's runs had finished when B's last one did. Goal: fair share costs at most 10% of turns/s.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

from tests.bench.bench_worker import ZERO_LATENCY, _env, _stop, _workers
from turnstile.jobs.support.scenarios import GOAL, USER
from turnstile.worker.broker.producer import sender
from turnstile.worker.client._client import Client
from turnstile.worker.dev.embedded import EmbeddedServer
from turnstile.worker.settings import Settings
from turnstile.worker.store import keys
from turnstile.worker.store.connect import connect

# Fair share on with eager continuation (the default, TURNSTILE_EAGER_TURNS=8), on with every
# step through the queue, and off (every step published at once, first come first served).
SETTINGS = {"on": (True, "8"), "on, eager off": (True, "0"), "off": (False, "0")}


def _client(store: EmbeddedServer, broker: EmbeddedServer, fair: bool) -> Client:
    config = Settings(redis_url=store.url, broker_url=broker.url, fair_share=fair)
    return Client(connect(store.url, config), config, sender(config))


def _env_for(
    broker: EmbeddedServer, store: EmbeddedServer, counts: Path, setting: tuple[bool, str]
) -> Any:
    fair, eager = setting
    env = _env(broker.url, store.url, counts, store.port, eager=eager)
    env["TURNSTILE_FAIR_SHARE"] = "1" if fair else "0"
    return env


def _turns(client: Client, tenant: str) -> int:
    turns = 0
    for run_id in client.client.zrange(keys.runs(tenant), 0, -1):
        state = json.loads(str(client.client.hget(keys.run(tenant, str(run_id)), "state")))
        turns += state["usage"]["steps"]
    return turns


def cost_round(
    broker: EmbeddedServer,
    store: EmbeddedServer,
    runs: int,
    work: Path,
    *,
    tenants: int,
    setting: tuple[bool, str],
) -> tuple[float, float]:
    """(turns/s, pool round trips per turn) for `runs` runs spread over `tenants` tenants."""
    queue, tag = f"c-{uuid.uuid4().hex[:6]}", uuid.uuid4().hex[:6]
    names = [f"t{i}-{tag}" for i in range(tenants)]
    counts = Path(tempfile.mkdtemp(dir=work))
    client = _client(store, broker, setting[0])
    for i in range(runs):
        client.submit(names[i % tenants], USER, "support", GOAL, ZERO_LATENCY, queue=queue)
    env = _env_for(broker, store, counts, setting)
    procs = _workers("turnstile.worker.runtime.app:app", queue, env, 2, work / f"{queue}.log")
    try:
        started = time.perf_counter()
        while sum(int(client.client.scard(keys.by_status(t, "stopped"))) for t in names) < runs:
            time.sleep(0.01)
        seconds = time.perf_counter() - started
    finally:
        _stop(procs)
    turns = sum(_turns(client, t) for t in names)
    totals = [json.loads(p.read_text()) for p in counts.glob("*.json")]
    return turns / seconds, sum(t["round_trips"] for t in totals) / max(1, turns)


def _at(event: dict[str, Any]) -> float:
    return datetime.fromisoformat(str(event["at"])).timestamp()


def _first_turn_s(client: Client, tenant: str, run_id: str) -> float:
    events = [e for _, e in client.store.events(tenant, run_id)]
    submitted = next(e for e in events if e["type"] == "submitted")
    return _at(next(e for e in events if e["type"] == "turn")) - _at(submitted)


def starvation_round(
    broker: EmbeddedServer,
    store: EmbeddedServer,
    flood: int,
    work: Path,
    setting: tuple[bool, str],
) -> tuple[float, float, int]:
    """(B's first-turn p50 s, p95 s, A's runs finished when B's last one did)."""
    queue, tag = f"s-{uuid.uuid4().hex[:6]}", uuid.uuid4().hex[:6]
    a, b = f"a-{tag}", f"b-{tag}"
    fair = setting[0]
    client = _client(store, broker, fair)
    procs = _workers("turnstile.worker.runtime.app:app", queue,
                     _env_for(broker, store, Path(tempfile.mkdtemp(dir=work)), setting), 2,
                     work / f"{queue}.log")  # fmt: skip
    try:

        def submit_a() -> None:
            own = _client(store, broker, fair)
            for _ in range(flood):
                own.submit(a, USER, "support", GOAL, ZERO_LATENCY, queue=queue)

        flooding = threading.Thread(target=submit_a)
        flooding.start()
        time.sleep(1.0)
        b_ids = [client.submit(b, USER, "support", GOAL, ZERO_LATENCY, queue=queue)
                 for _ in range(20)]  # fmt: skip
        while int(client.client.scard(keys.by_status(b, "stopped"))) < len(b_ids):
            time.sleep(0.01)
        a_done = int(client.client.scard(keys.by_status(a, "stopped")))
        flooding.join()
        while int(client.client.scard(keys.by_status(a, "stopped"))) < flood:
            time.sleep(0.05)  # let A finish, so the next round starts on an idle server
    finally:
        _stop(procs)
    waits = sorted(_first_turn_s(client, b, r) for r in b_ids)
    return statistics.median(waits), waits[int(0.95 * (len(waits) - 1))], a_done


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--tenants", type=int, default=4)
    parser.add_argument("--flood", type=int, default=600)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="turnstile-bench-fair-"))
    rates: dict[str, list[float]] = {k: [] for k in SETTINGS}
    p95s: dict[str, list[float]] = {k: [] for k in SETTINGS}
    with EmbeddedServer() as broker, EmbeddedServer() as store:
        for i in range(args.rounds):
            line = []
            for name, setting in SETTINGS.items():
                rate, rts = cost_round(
                    broker, store, args.runs, work, tenants=args.tenants, setting=setting
                )
                rates[name].append(rate)
                line.append(f"fair {name}: {rate:6.1f} turns/s, {rts:4.2f} round trips/turn")
            print(f"round {i + 1} cost: " + "; ".join(line), flush=True)
        ratio = [on / off for on, off in zip(rates["on"], rates["off"], strict=True)]
        print(f"turns/s fair on over off: median {statistics.median(ratio):.2f} "
              f"(rounds {', '.join(f'{r:.2f}' for r in ratio)}; goal >= 0.90)")  # fmt: skip
        for name, setting in SETTINGS.items():
            p50, p95, a_done = starvation_round(broker, store, args.flood, work, setting)
            p95s[name].append(p95)
            print(
                f"starvation, fair {name}: B's first turn p50 {p50:.2f} s, p95 {p95:.2f} s; "
                f"A had finished {a_done}/{args.flood} when B's 20 had",
                flush=True,
            )
        eager = p95s["on"][0] / max(1e-9, p95s["on, eager off"][0])
        print(f"B's first-turn p95, eager on over off: {eager:.2f} (goal <= 1.20)")


if __name__ == "__main__":
    main()
