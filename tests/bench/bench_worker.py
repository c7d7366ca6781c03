"""Benchmark: turns per second of the support job on two worker processes, against a no-op
Celery task that re-enqueues itself as often, on the same broker with the same settings; and
the client round trips to the store per turn, beyond the broker's own.

    uv run python -m tests.bench.bench_worker [--runs 200] [--rounds 3]
        [--durability none,none@always,aof,replica]
        [--task-events] [--pool prefork|gevent] [--concurrency N]

Broker and store are two servers, both with AOF; the round trips are counted on the client
for the store's port only. Work is enqueued first and
the clock runs from the workers being ready to the last run ending, for both workloads; the
no-op messages carry the same time limits a step's do. The two workloads alternate
round by round and the ratio is taken per round, so a noisy machine skews both alike.
The support job's tools keep its shop in the store: their round trips are the job's work and
are shown apart. Goals: a ratio of at least 1.0 and at most 3 round trips per turn.

`--pool gevent --concurrency N` runs both workloads on the green pool, N in flight per process
(the turn's waits on the store then overlap; the default is prefork with one pool process each).
`--durability` lists TURNSTILE_DURABILITY settings to measure side by side in each round (the
first is the one compared with the no-op). Each runs on the servers' fsync policy it is meant
for: `aof` on `appendfsync always` (the one it accepts), `none` and `replica` on `everysec`
(`replica` adds a replica following the store); `setting@policy` picks another, e.g.
`none@always` for the cost of the policy alone. The no-op runs on the everysec broker.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import redis

from tests.bench.noop_app import HARD_LIMIT_S, SOFT_LIMIT_S
from tests.bench.noop_app import app as noop_app
from turnstile.jobs.support.scenarios import GOAL, USER
from turnstile.worker.broker.producer import sender
from turnstile.worker.client._client import Client
from turnstile.worker.dev.embedded import EmbeddedServer
from turnstile.worker.settings import Settings
from turnstile.worker.store import keys
from turnstile.worker.store.connect import connect
from turnstile.worker.store.durability import Durability

TASK_EVENTS = ["0"]  # TURNSTILE_TASK_EVENTS for both workloads' workers (--task-events)
POOL = ["prefork", "1"]  # both workloads' pool and its concurrency (--pool, --concurrency)
ZERO_LATENCY = {
    "model_latency_s": 0,
    "tool_latency_s": {
        "get_order": 0,
        "search_policy": 0,
        "issue_refund": 0,
        "send_status_email": 0,
    },
}


def _workers(
    app: str, queue: str, env: dict[str, str], count: int, log: Path
) -> list[subprocess.Popen[bytes]]:
    procs = []
    with log.open("ab") as out:
        for i in range(count):
            args = [
                sys.executable, "-m", "tests.bench.counted_worker", "-A", app, "worker",
                "-Q", queue, "-P", POOL[0], "-c", POOL[1],
                "-n", f"bench{i}-{uuid.uuid4().hex[:6]}@%h",
                "--without-gossip", "--without-mingle", "--without-heartbeat", "-l", "WARNING",
            ]  # fmt: skip
            procs.append(subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT))
    deadline = time.monotonic() + 60
    while log.read_text(errors="replace").count('"worker_ready"') < count:
        if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
            raise RuntimeError(log.read_text(errors="replace")[-2000:])
        time.sleep(0.05)
    return procs


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        p.send_signal(signal.SIGTERM)
    for p in procs:
        p.wait(60)


def _env(
    broker: str, store: str | None, count_dir: Path, count_port: int, durability: str = "none"
) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TURNSTILE_")}
    env["TURNSTILE_TASK_EVENTS"] = TASK_EVENTS[0]
    env["TURNSTILE_POOL"], env["TURNSTILE_CONCURRENCY"] = POOL
    env.update(
        TURNSTILE_BROKER_URL=broker, TURNSTILE_LOG_FORMAT="json",
        BENCH_COUNT_DIR=str(count_dir), BENCH_COUNT_PORT=str(count_port),
        TURNSTILE_DURABILITY=durability,
    )  # fmt: skip
    if store:
        env["TURNSTILE_REDIS_URL"] = store
    return env


# The fsync policy each setting runs on unless `setting@policy` says otherwise.
POLICY = {Durability.NONE: "everysec", Durability.AOF: "always", Durability.REPLICA: "everysec"}


def setting(spec: str) -> tuple[str, str]:
    """(durability, fsync policy) of a `--durability` entry: `aof`, `none@always`."""
    durability, _, policy = spec.partition("@")
    return durability, policy or POLICY[Durability(durability)]


def support_round(
    broker: EmbeddedServer, store: EmbeddedServer, runs: int, work: Path, durability: str = "none"
) -> tuple[float, int, tuple[int, int], int]:
    """(seconds, turns, (the steps' round trips, the tools'), tasks) for `runs` support runs
    on two workers. The runs
    are submitted first; the clock runs from the workers being ready to the last run ending."""
    queue, tenant = f"s-{uuid.uuid4().hex[:6]}", f"bench-{uuid.uuid4().hex[:6]}"
    counts = Path(tempfile.mkdtemp(dir=work))
    config = Settings(redis_url=store.url, broker_url=broker.url, durability=Durability(durability))
    client = Client(connect(store.url, config), config, sender(config))
    for _ in range(runs):
        client.submit(tenant, USER, "support", GOAL, ZERO_LATENCY, queue=queue)
    env = _env(broker.url, store.url, counts, store.port, durability)
    procs = _workers("turnstile.worker.runtime.app:app", queue, env, 2, work / f"{queue}.log")
    try:
        started = time.perf_counter()
        stopped = keys.by_status(tenant, "stopped")
        while int(client.client.scard(stopped)) < runs:
            time.sleep(0.01)
        seconds = time.perf_counter() - started
    finally:
        _stop(procs)
    turns = 0
    for run_id in client.client.zrange(keys.runs(tenant), 0, -1):
        state = json.loads(str(client.client.hget(keys.run(tenant, str(run_id)), "state")))
        turns += state["usage"]["steps"]
    totals = [json.loads(p.read_text()) for p in counts.glob("*.json")]
    trips = (sum(t["round_trips"] for t in totals), sum(t["tool_round_trips"] for t in totals))
    return seconds, turns, trips, sum(t["tasks"] for t in totals)


def noop_round(broker: EmbeddedServer, chains: int, length: int, work: Path) -> float:
    """Seconds for `chains` chains of `length` no-op tasks, sent with a step's time limits,
    timed the same way as the support runs."""
    queue = f"n-{uuid.uuid4().hex[:6]}"
    counts = Path(tempfile.mkdtemp(dir=work))
    noop_app.conf.update(broker_url=broker.url)
    done = redis.Redis.from_url(broker.url)
    for _ in range(chains):
        noop_app.send_task(
            "bench.noop", kwargs={"remaining": length, "queue": queue},
            queue=queue, priority=9, soft_time_limit=SOFT_LIMIT_S, time_limit=HARD_LIMIT_S,
        )  # fmt: skip
    env = _env(broker.url, None, counts, 0)
    procs = _workers("tests.bench.noop_app:app", queue, env, 2, work / f"{queue}.log")
    try:
        started = time.perf_counter()
        while int(done.get(f"bench:done:{queue}") or 0) < chains:
            time.sleep(0.01)
        return time.perf_counter() - started
    finally:
        _stop(procs)


def _follow(primary: EmbeddedServer, replica: EmbeddedServer) -> None:
    follower = redis.Redis.from_url(replica.url)
    follower.replicaof("127.0.0.1", primary.port)
    deadline = time.monotonic() + 30
    while follower.info("replication").get("master_link_status") != "up":
        if time.monotonic() > deadline:
            raise RuntimeError("the replica did not sync")
        time.sleep(0.05)
    follower.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--durability", default="none,aof", help="settings[@fsync policy], comma-separated"
    )
    parser.add_argument(
        "--task-events", action="store_true", help="Celery's task events on, for both workloads"
    )
    parser.add_argument("--pool", choices=["prefork", "gevent"], default="prefork")
    parser.add_argument("--concurrency", type=int, default=1, help="per worker process")
    args = parser.parse_args()
    TASK_EVENTS[0] = "1" if args.task_events else "0"
    POOL[:] = [args.pool, str(args.concurrency)]
    settings = [d.strip() for d in args.durability.split(",") if d.strip()]
    work = Path(tempfile.mkdtemp(prefix="turnstile-bench-"))
    ratios, rts, tool_rts = [], [], []
    rates: dict[str, list[float]] = {d: [] for d in settings}
    policies = sorted({setting(d)[1] for d in settings} | {"everysec"})
    with contextlib.ExitStack() as stack:
        servers = {
            policy: (
                stack.enter_context(EmbeddedServer(appendonly=True, appendfsync=policy)),
                stack.enter_context(EmbeddedServer(appendonly=True, appendfsync=policy)),
            )
            for policy in policies
        }  # (broker, store) for each fsync policy, as one production server would be both
        if any(setting(d)[0] == Durability.REPLICA for d in settings):
            replica = stack.enter_context(EmbeddedServer(appendonly=True))
            _follow(servers[POLICY[Durability.REPLICA]][1], replica)
        print(f"{'round':>5} " + " ".join(f"{'turns/s ' + d:>22}" for d in settings)
              + f" {'no-op tasks/s':>14} {'ratio':>6} {'store round trips/turn':>23}"
              f" {'tools round trips/turn':>23}")  # fmt: skip
        for i in range(args.rounds):
            turns_by = {}
            for d in settings:
                durability, policy = setting(d)
                broker, store = servers[policy]
                seconds, turns, round_trips, tasks = support_round(
                    broker, store, args.runs, work, durability
                )
                rates[d].append(turns / seconds)
                turns_by[d] = turns
                if d == settings[0]:
                    rts.append(round_trips[0] / max(1, tasks))
                    tool_rts.append(round_trips[1] / max(1, tasks))
            length = round(turns_by[settings[0]] / args.runs)
            noop_seconds = noop_round(servers["everysec"][0], args.runs, length, work)
            noop_rate = args.runs * length / noop_seconds
            ratios.append(rates[settings[0]][-1] / noop_rate)
            print(f"{i + 1:>5} " + " ".join(f"{rates[d][-1]:>22.1f}" for d in settings)
                  + f" {noop_rate:>14.1f} {ratios[-1]:>6.2f} {rts[-1]:>23.2f}"
                  f" {tool_rts[-1]:>23.2f}")  # fmt: skip
    print(f"median ratio ({settings[0]}) {statistics.median(ratios):.2f} (goal >= 1.0); "
          f"median store round trips per turn {statistics.median(rts):.2f} (goal <= 3), "
          f"and the job's tools' {statistics.median(tool_rts):.2f}")  # fmt: skip
    for d in settings[1:]:
        per_round = [r / base for r, base in zip(rates[d], rates[settings[0]], strict=True)]
        print(f"turns/s with durability {d} over {settings[0]}: median "
              f"{statistics.median(per_round):.2f} (per round: "
              f"{', '.join(f'{x:.2f}' for x in per_round)})")  # fmt: skip


if __name__ == "__main__":
    main()
