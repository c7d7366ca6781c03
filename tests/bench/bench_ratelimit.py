"""Benchmark: a provider's rate limit, kept by the fleet or not. 300 one-turn runs on two green
workers (gevent, 200 turns in flight each) against the wire-format provider, which keeps 120
requests a minute (a token bucket: 120 at once, then 2 a second; or, `--window sliding`, at
most 120 in any 60 s) and answers 429 beyond it, with the wait in `retry-after`. Two variants,
each on a store of its own:

- limits set: `turnstile limits set openai:gpt-4.1-mini rpm=LIMIT` (default: the provider's own
  figure, with the default burst);
- limits unset: every turn calls the provider when it runs (the 429 storm: each turn retries
  after the wait the provider asks for, four attempts at most; `--skip-unset` leaves it out).

    uv run python -m tests.bench.bench_ratelimit [--runs 300] [--limit 120] [--provider-rpm 120]
                                                 [--window bucket|sliding] [--skip-unset]

For each: the provider's 429s (all, and after the first window: 60 s from the first request),
runs completed and not, and throughput: the requests the provider answered per minute after
the first window, against its limit. Goals: with limits set, no 429 after the first window
and throughput within 10% of the provider's limit.
"""

from __future__ import annotations

import argparse
import time
import uuid
from collections import Counter
from typing import Any

from tests.integration.workers import WorkerProcess, client_for, stop_all
from tests.wire.wire import exchanges, wire_server
from turnstile.jobs.support.scenarios import GOAL, USER
from turnstile.worker.dev.embedded import EmbeddedServer
from turnstile.worker.scheduling import ratelimits

MODEL = "openai:gpt-4.1-mini"
FINAL = exchanges("openai", "support_run")[-1]  # a final answer: every run is one turn
BUDGET = {"max_tokens": 40_000, "deadline_ms": 600_000}  # waits of minutes fit the deadline
WINDOW_S = 60.0
READY_S = 180.0


def _start(url: str, queue: str, env: dict[str, str], count: int) -> list[WorkerProcess]:
    workers = [
        WorkerProcess(url, [queue], name=f"rl{i}-{uuid.uuid4().hex[:6]}", env=env,
                      concurrency=4, pool="gevent").start()  # 4 x 50: 200 turns in flight
        for i in range(count)
    ]  # fmt: skip
    deadline = time.monotonic() + READY_S
    for worker in workers:
        while '"worker_ready"' not in worker.log():
            if time.monotonic() > deadline:
                stop_all(workers)
                raise RuntimeError(f"worker not ready: {worker.log()[-2000:]}")
            time.sleep(0.2)
    return workers


def variant(limit: int | None, runs: int, provider_rpm: int, window: str) -> dict[str, Any]:
    """One variant on a store of its own: what the provider saw, and how the runs ended."""
    queue, tenant = f"q-{uuid.uuid4().hex[:6]}", "bench"
    script = {"always": FINAL, "rpm": provider_rpm, "window": window}
    with EmbeddedServer() as store, wire_server("openai", script=script) as wire:
        client = client_for(store.url)
        if limit is not None:
            ratelimits.set_limits(
                client.client, MODEL, {"rpm": limit}, providers=client.config.providers
            )
        workers = _start(store.url, queue, dict(wire.env), 2)
        try:
            run_ids = [
                client.submit(
                    tenant, USER, "support", GOAL, {"model": MODEL}, budget=BUDGET, queue=queue
                )
                for _ in range(runs)
            ]
            pending = set(run_ids)
            while pending:
                time.sleep(1.0)
                pipe = client.client.pipeline(transaction=False)
                for run_id in pending:
                    pipe.hget(f"turnstile:{{{tenant}}}:run:{run_id}", "status")
                statuses = pipe.execute()
                pending = {r for r, s in zip(pending, statuses, strict=True) if s != "stopped"}
            ended = time.monotonic()
            outcomes = Counter(str(client.run_hash(r)[1].get("outcome")) for r in run_ids)
            deferrals = sum(
                1 for r in run_ids for _, e in client.store.events(tenant, r)
                if e["type"] == "rate_limited"
            )  # fmt: skip
        finally:
            stop_all(workers)
        asked = wire.received()
    first = min(a["t"] for a in asked)
    answered = sorted(a["t"] for a in asked if not a.get("limited"))
    limited = [a["t"] for a in asked if a.get("limited")]
    steady = [t for t in answered if t >= first + WINDOW_S]
    span = (answered[-1] - (first + WINDOW_S)) if steady else 0.0
    return {
        "limit": limit,
        "requests": len(asked),
        "answered": len(answered),
        "429s": len(limited),
        "429s after the first window": sum(t >= first + WINDOW_S for t in limited),
        "per minute after the first window": round(len(steady) / span * 60, 1) if span else None,
        "per minute overall": round(len(answered) / (answered[-1] - first) * 60, 1),
        "seconds": round(ended - first, 1) if ended > first else None,
        "outcomes": dict(outcomes),
        "deferrals": deferrals,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--provider-rpm", type=int, default=120)
    parser.add_argument("--limit", type=int, default=None, help="default: --provider-rpm")
    parser.add_argument("--window", choices=("bucket", "sliding"), default="bucket")
    parser.add_argument("--skip-unset", action="store_true")
    args = parser.parse_args()
    args.limit = args.limit or args.provider_rpm
    print(f"{args.runs} one-turn runs, 2 gevent workers x 200, provider at "
          f"{args.provider_rpm} requests/min ({args.window})", flush=True)  # fmt: skip
    results = []
    for limit in (args.limit,) if args.skip_unset else (args.limit, None):
        got = variant(limit, args.runs, args.provider_rpm, args.window)
        results.append(got)
        print(f"limits set: rpm={limit}" if limit else "limits unset", got, flush=True)
    kept = results[0]
    steady = kept["per minute after the first window"] or 0.0
    print(
        f"\nlimits set (rpm={args.limit}): {kept['429s']} 429s "
        f"({kept['429s after the first window']} after the first window), "
        f"{steady} requests/min after the first window "
        f"({steady / args.provider_rpm:.0%} of the provider's {args.provider_rpm}), "
        f"{kept['outcomes']}, {kept['deferrals']} deferrals, {kept['seconds']} s"
    )
    if not args.skip_unset:
        storm = results[1]
        print(
            f"limits unset: {storm['429s']} 429s "
            f"({storm['429s after the first window']} after the first window), "
            f"{storm['outcomes']}, {storm['seconds']} s"
        )
    ok = kept["429s after the first window"] == 0 and abs(steady - args.provider_rpm) <= (
        0.1 * args.provider_rpm
    )
    print("goal met" if ok else "goal NOT met", flush=True)


if __name__ == "__main__":
    main()
