"""Measure: bytes the store keeps per finished support run, until retention removes it.

    uv run python -m tests.bench.bench_storage [--runs 200]

Starts its own server and two worker processes, runs `--runs` support runs (the reference scenarios'
scenario A: a refund and an e-mail, five turns) to the end with no model or tool latency, and
sums MEMORY USAGE (SAMPLES 0: every element counted) of each run's keys: its hash and its
event stream; then the tenant's indexes that name finished runs (runs zset, stopped and
outcome sets) and the run-tenants map, divided by the number of runs. With 200 runs the
indexes are past their compact encodings (128 entries), as in production. The ledger's
records of the runs' reservations (kept a week, for replays) are reported beside it, apart.
Last, a retention pass with TURNSTILE_RETAIN_FINISHED_S=0 lists what is left under the
tenant's tag: nothing, not even an empty index.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import uuid
from typing import Any

import redis

from tests.integration.workers import client_for, running_workers, settled
from turnstile.jobs.support.scenarios import GOAL, USER
from turnstile.ledger.keys import tenant_keys
from turnstile.worker.dev.embedded import EmbeddedServer
from turnstile.worker.scheduling import retention
from turnstile.worker.settings import Settings
from turnstile.worker.store import keys

ZERO_LATENCY: dict[str, Any] = {
    "model_latency_s": 0,
    "tool_latency_s": {"get_order": 0, "search_policy": 0, "issue_refund": 0,
                       "send_status_email": 0},
}  # fmt: skip


def _bytes(r: redis.Redis, key: str) -> int:
    return int(r.memory_usage(key, samples=0) or 0)


def measure(runs: int) -> dict[str, Any]:
    tenant, queue = f"bench-{uuid.uuid4().hex[:8]}", f"bench-{uuid.uuid4().hex[:8]}"
    with EmbeddedServer() as server, running_workers(server.url, [queue], 2):
        client = client_for(server.url)
        ids = [
            client.submit(tenant, USER, "support", GOAL, ZERO_LATENCY, queue=queue)
            for _ in range(runs)
        ]
        deadline = time.monotonic() + 600
        while not settled(client, ids):
            if time.monotonic() > deadline:
                raise SystemExit("runs did not finish in 10 minutes")
            time.sleep(0.2)
        r = client.client
        hashes = [_bytes(r, keys.run(tenant, run_id)) for run_id in ids]
        streams = [_bytes(r, keys.events(tenant, run_id)) for run_id in ids]
        events = [int(r.xlen(keys.events(tenant, run_id))) for run_id in ids]
        outcomes = {client.state(run_id).outcome for run_id in ids}
        index_keys = [keys.runs(tenant), keys.by_status(tenant, "stopped"), keys.RUN_TENANTS]
        index_keys += [keys.by_outcome(tenant, str(o)) for o in outcomes if o]
        indexes = sum(_bytes(r, k) for k in index_keys)
        ledger = sum(_bytes(r, k) for k in tenant_keys(tenant))
        # Then a retention pass with no time to keep: what is left of the runs.
        removed = retention.retain(r, Settings(retain_finished_s=0), client.ledger).runs
        left = [k for k in r.scan_iter(f"{keys.PREFIX}:{{{tenant}}}:*", count=1000)]
    per_run = {
        "hash": round(statistics.mean(hashes)),
        "events_stream": round(statistics.mean(streams)),
        "index_entries": round(indexes / runs),
    }
    return {
        "runs": runs,
        "outcomes": sorted(str(o) for o in outcomes),
        "events_per_run": statistics.mean(events),
        "bytes_per_run": {**per_run, "total": sum(per_run.values())},
        "ledger_bytes_per_run": round(ledger / runs),
        "after_retention": {"runs_removed": removed, "run_keys_left": sorted(map(str, left))},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    args = parser.parse_args()
    print(json.dumps(measure(args.runs), indent=2))


if __name__ == "__main__":
    main()
