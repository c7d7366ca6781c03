"""Benchmark: turns per second of the support job on two worker processes, against a no-op
Celery task that re-enqueues itself as often, on the same broker with the same settings; and
the client round trips to the store per turn, beyond the broker's own.

    uv run python -m tests.bench.bench_worker [--runs 200] [--rounds 3]
        [--durability none,none@always,aof,replica]
        [--task-events] [--pool prefork|gevent] [--concurrency N]
        [--brokers redis,amqp] [--amqp-url amqp://guest:guest@127.0.0.1:5672//]
        [--stores single,cluster] [--profile DIR] [--kombu-poller]

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
The settings of a round share their servers, and each round starts one setting further on, so
none is always first or always after the same other (on one machine the first of a round read
~20% faster than the same code after it); a setting during which a server rewrote its AOF (a
forked child on the same cores) says so.

`--brokers redis,amqp` measures each setting on both brokers side by side in each round: the
store's own kind of server (Redis) and RabbitMQ (`--amqp-url`, quorum queues, publisher
confirms), the store the same; it prints the ratio RabbitMQ/Redis per setting and round.

`--stores single,cluster` measures each of those with the store and the ledger on one server
and on a 3-primary Valkey Cluster (AOF, everysec, as the single store), side by side in each
round, and prints each configuration's turns/s over the single-server, Redis-broker one (so
`--brokers redis,amqp --stores single,cluster` gives cluster + RabbitMQ over one server). A
cluster's round trips are not counted (they go to three ports).
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import redis

from tests.bench.noop_app import HARD_LIMIT_S, SOFT_LIMIT_S
from tests.bench.noop_app import app as noop_app
from tests.cluster import EmbeddedCluster
from tests.integration.rabbitmq import AMQP_URL, delete_queues
from turnstile.jobs.support.scenarios import GOAL, USER
from turnstile.worker.broker import amqp
from turnstile.worker.broker.producer import sender
from turnstile.worker.client._client import Client
from turnstile.worker.dev.embedded import EmbeddedServer
from turnstile.worker.names import ANY_QUEUE
from turnstile.worker.settings import Settings
from turnstile.worker.store import keys
from turnstile.worker.store.connect import connect
from turnstile.worker.store.durability import Durability

# (durability setting, eager turns, broker: redis or amqp, store: single or cluster)
Config = tuple[str, str, str, str]
# A loaded machine takes a while to import a worker; the clock starts once they are ready.
READY_S = 180.0
AMQP_QUEUES: list[tuple[str, str]] = []  # (url, queue) made on RabbitMQ, deleted at the end
TASK_EVENTS = ["0"]  # TURNSTILE_TASK_EVENTS for both workloads' workers (--task-events)
POOL = ["prefork", "1"]  # both workloads' pool and its concurrency (--pool, --concurrency)
KOMBU_POLLER = [False]  # --kombu-poller: kombu's own poller, without the wake-up on an ack
PROFILE: list[str] = []  # --profile DIR: the support workers run under cProfile, saved there
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
    app: str, queue: str, env: dict[str, str], count: int, log: Path, *, tree: Path | None = None
) -> list[subprocess.Popen[bytes]]:
    python = str(tree / ".venv" / "bin" / "python") if tree is not None else sys.executable
    procs = []
    with log.open("ab") as out:
        for i in range(count):
            args = [
                python, "-m", "tests.bench.counted_worker", "-A", app, "worker",
                "-Q", queue, "-P", POOL[0], "-c", POOL[1],
                "-n", f"bench{i}-{uuid.uuid4().hex[:6]}@%h",
                "--without-gossip", "--without-mingle", "--without-heartbeat", "-l", "WARNING",
            ]  # fmt: skip
            procs.append(
                subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=tree)
            )
    deadline = time.monotonic() + READY_S
    while log.read_text(errors="replace").count('"worker_ready"') < count:
        if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
            for p in procs:  # none is left behind
                p.kill()
                p.wait(10)
            raise RuntimeError(f"workers not ready: {log.read_text(errors='replace')[-2000:]}")
        time.sleep(0.05)
    return procs


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        p.send_signal(signal.SIGTERM)
    for p in procs:
        p.wait(60)


def _env(
    broker: str,
    store: str | None,
    count_dir: Path,
    count_port: int,
    *,
    durability: str = "none",
    eager: str | None = None,
) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TURNSTILE_")}
    env["TURNSTILE_TASK_EVENTS"] = TASK_EVENTS[0]
    env["TURNSTILE_POOL"], env["TURNSTILE_CONCURRENCY"] = POOL
    env.update(
        TURNSTILE_BROKER_URL=broker, TURNSTILE_LOG_FORMAT="json",
        BENCH_COUNT_DIR=str(count_dir), BENCH_COUNT_PORT=str(count_port),
        TURNSTILE_DURABILITY=durability,
    )  # fmt: skip
    if eager is not None:  # else the worker's default
        env["TURNSTILE_EAGER_TURNS"] = eager
    if store:
        env["TURNSTILE_REDIS_URL"] = store
        if PROFILE:
            env["BENCH_PROFILE_DIR"] = PROFILE[0]
        if KOMBU_POLLER[0]:
            env["BENCH_KOMBU_POLLER"] = "1"
    return env


# The fsync policy each setting runs on unless `setting@policy` says otherwise.
# The cluster's nodes keep an AOF as the single store does (everysec).
CLUSTER_NODE_ARGS = ["--appendonly", "yes", "--appendfsync", "everysec"]

POLICY = {Durability.NONE: "everysec", Durability.AOF: "always", Durability.REPLICA: "everysec"}


def setting(spec: str) -> tuple[str, str]:
    """(durability, fsync policy) of a `--durability` entry: `aof`, `none@always`; a `#tree`
    after it (`--trees`) names the source tree the workers run from."""
    durability, _, policy = spec.partition("#")[0].partition("@")
    return durability, policy or POLICY[Durability(durability)]


# --trees NAME=DIR,...: the support workers of each setting run from each of these checkouts
# (their own virtualenv's Python, in their directory), side by side in every round.
TREES: dict[str, Path] = {}


def parse_trees(trees: str, parser: argparse.ArgumentParser) -> dict[str, Path]:
    """`--trees NAME=DIR,...` as {name: checkout}, in the order given; a parser error for an
    entry that names no checkout with its .venv (bench_latency takes the same option)."""
    out: dict[str, Path] = {}
    for entry in (t.strip() for t in trees.split(",") if t.strip()):
        name, _, where = entry.partition("=")
        if not (name and where and (Path(where) / ".venv" / "bin" / "python").exists()):
            parser.error(f"--trees: {entry!r} is not NAME=DIR of a checkout with its .venv")
        out[name] = Path(where).resolve()
    return out


def with_trees(durabilities: list[str], trees: str, parser: argparse.ArgumentParser) -> list[str]:
    """The `--durability` entries, each once per `--trees` checkout (`setting#name`), the
    first tree's first; as given without --trees."""
    TREES.update(parse_trees(trees, parser))
    return [f"{d}#{name}" for d in durabilities for name in TREES] if TREES else durabilities


def tree_of(spec: str) -> Path | None:
    """The checkout a `--durability` entry's `#tree` names (--trees), or None: this one."""
    name = spec.partition("#")[2]
    return TREES[name] if name else None


@dataclass
class Round:
    """What one workload of support runs measured."""

    seconds: float
    turns: int
    step_trips: int  # the steps' round trips to the store
    tool_trips: int  # the job's tools'
    gaps: dict[str, list[float]]  # seconds from a commit to the next turn, eager and queued
    stall_s: float  # the longest a slot stood free with nothing starting or ending (any process)
    cpu_s: float  # the worker processes' CPU time (user + system) over the timed window
    split: Split  # where that CPU went, and the servers' own
    rewrites: int = 0  # AOF rewrites of the store or the broker under way in the window
    # Deliveries running, mean over each process's span, summed; and the seconds a process
    # sat idle with a slot free, summed (counted_worker.idle_split)
    in_flight: float = 0.0
    idle_free_s: float = 0.0

    @property
    def rate(self) -> float:
        return self.turns / self.seconds

    @property
    def cpu_ms_per_turn(self) -> float:
        return 1000 * self.cpu_s / max(1, self.turns)


def cpu_parts(procs: list[subprocess.Popen[bytes]]) -> tuple[float, float, float, float]:
    """CPU seconds so far of the workers' main processes (Celery's consumer, the dispatcher
    and the sweeper) and of their pool processes (the tasks), apart, the pool processes' time
    in the kernel (system), and the time they waited for a core: the machine is shared, and
    CPU time is what load disturbs least."""
    main = pool = pool_sys = pool_queued = 0.0
    for p in procs:
        try:
            root = psutil.Process(p.pid)
            times = root.cpu_times()
            main += times.user + times.system
            for proc in root.children(recursive=True):
                times = proc.cpu_times()
                pool += times.user + times.system
                pool_sys += times.system
                pool_queued += queued_s(proc.pid)
        except psutil.NoSuchProcess:
            continue
    return main, pool, pool_sys, pool_queued


def queued_s(pid: int) -> float:
    """Seconds the threads of process `pid` have waited, runnable, for a core (Linux
    schedstat's run-queue wait): what the machine's other processes cost it."""
    total = 0
    for stat in Path(f"/proc/{pid}/task").glob("*/schedstat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            total += int(stat.read_text().split()[1])
    return total / 1e9


def pool_processes() -> int:
    """How many processes run the tasks: the pool processes of the two workers (prefork), or
    the two workers themselves (a green pool, whose turns run in its main process)."""
    return 2 * int(POOL[1]) if POOL[0] == "prefork" else 2


def pool_slots() -> int:
    """The slots of the two workers: their pool processes, or their greenlets."""
    return 2 * int(POOL[1])


def server_cpu_s(url: str) -> float:
    """CPU seconds so far of a server (INFO cpu): what the store's and the broker's work costs
    the shared cores while the workers wait for their replies."""
    with redis.Redis.from_url(url) as client:
        info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


@dataclass
class Split:
    """A timed window's CPU seconds: the workers' main processes, their pool processes, the
    store's server and the broker's (0 when not one server, a cluster or RabbitMQ)."""

    main_s: float = 0.0
    pool_s: float = 0.0
    store_s: float = 0.0
    broker_s: float = 0.0
    wall_s: float = 0.0
    pool_sys_s: float = 0.0  # of pool_s, in the kernel (system time)
    pool_queued_s: float = 0.0  # the pool processes' threads waiting, runnable, for a core
    processes: int = 2  # pool processes, for their wall time per turn

    def per(self, n: int) -> str:
        """The split, in ms per turn or task, and the cores busy over the window."""
        n = max(1, n)
        busy = (self.main_s + self.pool_s + self.store_s + self.broker_s) / max(1e-9, self.wall_s)
        # A pool process's wall time per turn: its CPU, its wait for a core, and the rest
        # (waiting on a socket or a lock: the store's, the broker's, its tool threads').
        wall = 1000 * self.wall_s * self.processes / n
        line = (f"main {1000 * self.main_s / n:.2f} + pool {1000 * self.pool_s / n:.2f} ms "
                f"(system {1000 * self.pool_sys_s / n:.2f}), "
                f"store {1000 * self.store_s / n:.2f}, broker {1000 * self.broker_s / n:.2f} ms; "
                f"{busy:.2f} of the cores busy")  # fmt: skip
        if not self.pool_s:  # a green pool: the turns ran in the main processes
            return line
        return (f"{line}; a pool process's {wall:.2f} ms: waiting for a core "
                f"{1000 * self.pool_queued_s / n:.2f}, on sockets and locks "
                f"{wall - 1000 * (self.pool_s + self.pool_queued_s) / n:.2f}")  # fmt: skip


def _servers_cpu(urls: list[str]) -> list[float]:
    return [server_cpu_s(u) if u.startswith("redis://") else 0.0 for u in urls]


def _rewrites(urls: list[str], *, ended: bool = False) -> int:
    """AOF rewrites of these servers (INFO persistence): those done since they started, and,
    at a window's end (`ended`), one more for each still under way; so the difference over a
    window counts each rewrite that overlapped it (one under way at its start ends later)."""
    total = 0
    for url in (u for u in urls if u.startswith("redis://")):
        with redis.Redis.from_url(url) as client:
            info = client.info("persistence")
        total += int(info.get("aof_rewrites", 0))
        total += int(info.get("aof_rewrite_in_progress", 0)) if ended else 0
    return total


def support_round(
    broker_url: str,
    store: EmbeddedServer | EmbeddedCluster,
    runs: int,
    work: Path,
    *,
    durability: str = "none",
    eager: str = "0",
    one_at_a_time: bool = False,
    tree: Path | None = None,
) -> Round:
    """`runs` support runs on two workers. The runs are submitted first and the clock runs
    from the workers being ready to the last run ending; `one_at_a_time`: the workers start
    first, and each run is submitted when the one before has ended (an idle system)."""
    queue, tenant = f"s-{uuid.uuid4().hex[:6]}", f"bench-{uuid.uuid4().hex[:6]}"
    counts = Path(tempfile.mkdtemp(dir=work))
    config = Settings(
        redis_url=store.url, broker_url=broker_url, durability=Durability(durability),
        submit_queues=ANY_QUEUE,  # the workers start after the runs are queued
    )  # fmt: skip
    client = Client(connect(store.url, config), config, sender(config))
    stopped = keys.by_status(tenant, "stopped")
    if not one_at_a_time:
        for _ in range(runs):
            client.submit(tenant, USER, "support", GOAL, ZERO_LATENCY, queue=queue)
    env = _env(broker_url, store.url, counts, store.port, durability=durability, eager=eager)
    procs = _workers(
        "turnstile.worker.runtime.app:app", queue, env, 2, work / f"{queue}.log", tree=tree
    )
    servers = [store.url if isinstance(store, EmbeddedServer) else "", broker_url]
    try:
        parts_before, servers_before = cpu_parts(procs), _servers_cpu(servers)
        rewrites_before = _rewrites(servers)
        started = time.perf_counter()
        for n in range(1, runs + 1) if one_at_a_time else [runs]:
            if one_at_a_time:
                client.submit(tenant, USER, "support", GOAL, ZERO_LATENCY, queue=queue)
            while int(client.client.scard(stopped)) < n:
                time.sleep(0.002 if one_at_a_time else 0.01)
        seconds = time.perf_counter() - started
        parts, servers_after = cpu_parts(procs), _servers_cpu(servers)
        rewrites = _rewrites(servers, ended=True) - rewrites_before
        split = Split(
            parts[0] - parts_before[0], parts[1] - parts_before[1],
            servers_after[0] - servers_before[0], servers_after[1] - servers_before[1], seconds,
            parts[2] - parts_before[2], parts[3] - parts_before[3], pool_processes(),
        )  # fmt: skip
        cpu = split.main_s + split.pool_s
    finally:
        _stop(procs)
        if amqp.is_amqp(broker_url):  # deleted at the end: a later round's dispatcher may
            AMQP_QUEUES.append((broker_url, queue))  # still send a stray step of this one
    turns = 0
    for run_id in client.client.zrange(keys.runs(tenant), 0, -1):
        state = json.loads(str(client.client.hget(keys.run(tenant, str(run_id)), "state")))
        turns += state["usage"]["steps"]
    totals = [json.loads(p.read_text()) for p in counts.glob("*.json")]
    if os.environ.get("BENCH_COUNT_DETAIL"):
        print_detail(totals, turns)
        print_gc(totals, turns)
    gaps: dict[str, list[float]] = {"eager": [], "queued": []}
    for t in totals:
        for path, samples in t.get("gaps", {}).items():
            gaps[path] += samples
    return Round(
        seconds, turns, sum(t["round_trips"] for t in totals),
        sum(t["tool_round_trips"] for t in totals), gaps,
        max((t.get("idle_with_free_slots_s", 0.0) for t in totals), default=0.0), cpu, split,
        rewrites, sum(t.get("idle_split", {}).get("mean_in_flight", 0.0) for t in totals),
        sum(t.get("idle_split", {}).get("idle_free_s", 0.0) for t in totals),
    )  # fmt: skip


def print_gc(totals: list[dict[str, Any]], turns: int) -> None:
    """BENCH_COUNT_DETAIL=1: the garbage collector's passes in the processes that ran the
    turns, by generation: how many a turn, and their CPU a turn."""
    by: dict[str, list[float]] = {}
    for t in totals:
        for generation, (count, seconds) in t.get("gc", {}).items():
            by.setdefault(generation, [0, 0.0])
            by[generation][0] += count
            by[generation][1] += seconds
    per = max(1, turns)
    print("  gc passes per turn: " + ", ".join(
        f"generation {g}: {c / per:.3f} ({1e6 * s / per:.1f} us a turn)"
        for g, (c, s) in sorted(by.items())
    ))  # fmt: skip


def print_detail(totals: list[dict[str, Any]], turns: int) -> None:
    """BENCH_COUNT_DETAIL=1: the step's round trips by what they sent (counted_worker.py)."""
    detail: dict[str, int] = {}
    for t in totals:
        for what, n in t.get("detail", {}).items():
            detail[what] = detail.get(what, 0) + n
    for what, n in sorted(detail.items(), key=lambda kv: -kv[1]):
        print(f"  {n / max(1, turns):6.3f} a turn  {n:6d}  {what}")


def percentile(samples: list[float], q: float) -> float:
    if not samples:
        return float("nan")
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def gap_line(label: str, gaps: dict[str, list[float]]) -> str:
    """p50 and p99 of the gap between turns, in ms, over both paths and for each."""
    both = gaps["eager"] + gaps["queued"]
    parts = [f"{label}: gap p50 {percentile(both, 0.5) * 1000:.2f} ms, p99 "
             f"{percentile(both, 0.99) * 1000:.2f} ms ({len(both)} gaps"]  # fmt: skip
    for path in ("eager", "queued"):
        if gaps[path]:
            parts.append(f"{path} {len(gaps[path])}: p50 {percentile(gaps[path], 0.5) * 1000:.2f}"
                         f" p99 {percentile(gaps[path], 0.99) * 1000:.2f}")  # fmt: skip
    return "; ".join(parts) + ")"


def noop_round(broker: EmbeddedServer, chains: int, length: int, work: Path) -> tuple[float, Split]:
    """Seconds for `chains` chains of `length` no-op tasks, sent with a step's time limits,
    timed the same way as the support runs, and the CPU seconds over that time."""
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
        parts_before, broker_before = cpu_parts(procs), server_cpu_s(broker.url)
        started = time.perf_counter()
        while int(done.get(f"bench:done:{queue}") or 0) < chains:
            time.sleep(0.01)
        seconds = time.perf_counter() - started
        parts = cpu_parts(procs)
        split = Split(parts[0] - parts_before[0], parts[1] - parts_before[1], 0.0,
                      server_cpu_s(broker.url) - broker_before, seconds,
                      parts[2] - parts_before[2], parts[3] - parts_before[3],
                      pool_processes())  # fmt: skip
        return seconds, split
    finally:
        _stop(procs)


def _delete_amqp_queues() -> None:
    for url, queue in AMQP_QUEUES:
        delete_queues(queue, url=url)


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
        "--eager", default="8,0", help="TURNSTILE_EAGER_TURNS values to measure, comma-separated"
    )
    parser.add_argument(
        "--idle-runs", type=int, default=20, help="runs one at a time, for the idle gap (0: none)"
    )
    parser.add_argument(
        "--task-events", action="store_true", help="Celery's task events on, for both workloads"
    )
    parser.add_argument("--pool", choices=["prefork", "gevent"], default="prefork")
    parser.add_argument("--concurrency", type=int, default=1, help="per worker process")
    parser.add_argument(
        "--brokers", default="redis", help="redis, amqp or both (comma-separated), side by side"
    )
    parser.add_argument("--amqp-url", default=AMQP_URL, help="RabbitMQ for --brokers amqp")
    parser.add_argument(
        "--stores", default="single", help="single, cluster or both (comma-separated)"
    )
    parser.add_argument(
        "--profile", default=None, help="a directory: the support workers' cProfile output"
    )
    parser.add_argument(
        "--trees", default="",
        help="NAME=DIR,...: run the support workers from these checkouts, side by side",
    )  # fmt: skip
    parser.add_argument(
        "--kombu-poller", action="store_true",
        help="the support workers on kombu's own poller (the green pool's stall, for comparison)",
    )  # fmt: skip
    args = parser.parse_args()
    KOMBU_POLLER[0] = args.kombu_poller
    if args.profile:
        Path(args.profile).mkdir(parents=True, exist_ok=True)
        PROFILE[:] = [str(Path(args.profile).resolve())]
    TASK_EVENTS[0] = "1" if args.task_events else "0"
    POOL[:] = [args.pool, str(args.concurrency)]
    durabilities = with_trees(
        [d.strip() for d in args.durability.split(",") if d.strip()], args.trees, parser
    )
    eagers = [e.strip() for e in args.eager.split(",") if e.strip()]
    brokers = [b.strip() for b in args.brokers.split(",") if b.strip()]
    # The first is the one compared with the no-op.
    stores = [s.strip() for s in args.stores.split(",") if s.strip()]
    if "cluster" in stores and any(
        setting(d) != (Durability.NONE, "everysec") for d in durabilities
    ):
        parser.error("--stores cluster measures durability none (everysec) only")
    configs = [(d, e, b, s) for s in stores for b in brokers for d in durabilities for e in eagers]
    label = {
        c: f"{c[0]} eager {c[1]}"
        + (f" {c[2]}" if len(brokers) > 1 else "")
        + (f" {c[3]}" if len(stores) > 1 else "")
        for c in configs
    }
    work = Path(tempfile.mkdtemp(prefix="turnstile-bench-"))
    ratios: list[float] = []
    rates: dict[Config, list[float]] = {c: [] for c in configs}
    trips: dict[Config, list[tuple[float, float]]] = {c: [] for c in configs}
    gaps: dict[Config, dict[str, list[float]]] = {c: {"eager": [], "queued": []} for c in configs}
    stalls: dict[Config, list[float]] = {c: [] for c in configs}
    cpu: dict[Config, list[float]] = {c: [] for c in configs}
    noop_cpu_ms: list[float] = []  # the no-op workers' CPU per task, per round
    splits: list[str] = []  # per round, where the CPU went: the first setting's, the no-op's
    rewrites: dict[Config, list[int]] = {c: [] for c in configs}  # AOF rewrites, per round
    policies = sorted({setting(d)[1] for d in durabilities} | {"everysec"})
    with contextlib.ExitStack() as stack:
        stack.callback(_delete_amqp_queues)  # however the rounds end
        servers = {
            policy: (
                stack.enter_context(EmbeddedServer(appendonly=True, appendfsync=policy)),
                stack.enter_context(EmbeddedServer(appendonly=True, appendfsync=policy)),
            )
            for policy in policies
        }  # (broker, store) for each fsync policy, as one production server would be both
        if any(setting(d)[0] == Durability.REPLICA for d in durabilities):
            replica = stack.enter_context(EmbeddedServer(appendonly=True))
            _follow(servers[POLICY[Durability.REPLICA]][1], replica)
        cluster = None
        if "cluster" in stores:
            cluster = stack.enter_context(EmbeddedCluster(node_args=CLUSTER_NODE_ARGS))
        print(f"{'round':>5} " + " ".join(f"{label[c]:>18}" for c in configs)
              + f" {'no-op tasks/s':>14} {'ratio':>6}")  # fmt: skip
        for i in range(args.rounds):
            turns_by = {}
            # Each round starts one setting further on: the settings share servers, and on one
            # machine the first of a round read ~20% faster than the same code after it (on
            # another, no clear order effect: docs/benchmarks.md), so no setting is always
            # first or always after a given other.
            shift = i % len(configs)
            for c in configs[shift:] + configs[:shift]:
                durability, policy = setting(c[0])
                broker, single = servers[policy]
                store = cluster if c[3] == "cluster" and cluster is not None else single
                broker_url = args.amqp_url if c[2] == "amqp" else broker.url
                measured = support_round(
                    broker_url, store, args.runs, work, durability=durability, eager=c[1],
                    tree=tree_of(c[0]),
                )  # fmt: skip
                rates[c].append(measured.rate)
                turns_by[c] = measured.turns
                per_turn = max(1, measured.turns)
                trips[c].append((measured.step_trips / per_turn, measured.tool_trips / per_turn))
                for path in ("eager", "queued"):
                    gaps[c][path] += measured.gaps[path]
                stalls[c].append(measured.stall_s)
                rewrites[c].append(measured.rewrites)
                cpu[c].append(measured.cpu_ms_per_turn)
                if c == configs[0]:
                    splits.append(
                        f"{label[c]}: {measured.split.per(measured.turns)}; deliveries "
                        f"running {measured.in_flight:.1f} of {pool_slots()} (mean), the "
                        f"workers idle with a slot free {measured.idle_free_s:.2f} s"
                    )
            length = round(turns_by[configs[0]] / args.runs)
            noop_seconds, noop_split = noop_round(servers["everysec"][0], args.runs, length, work)
            noop_rate = args.runs * length / noop_seconds
            noop_cpu = noop_split.main_s + noop_split.pool_s
            noop_cpu_ms.append(1000 * noop_cpu / (args.runs * length))
            splits[-1] += f"; no-op: {noop_split.per(args.runs * length)}"
            ratios.append(rates[configs[0]][-1] / noop_rate)
            print(f"{i + 1:>5} " + " ".join(f"{rates[c][-1]:>18.1f}" for c in configs)
                  + f" {noop_rate:>14.1f} {ratios[-1]:>6.2f}")  # fmt: skip
        for i, line in enumerate(splits):
            print(f"CPU, round {i + 1}, per turn (task): {line}")
        idle: dict[str, dict[str, list[float]]] = {}
        if args.idle_runs:
            broker, store = servers[setting(durabilities[0])[1]]
            for e in eagers:
                durability = setting(durabilities[0])[0]
                idle[e] = support_round(
                    broker.url, store, args.idle_runs, work, durability=durability, eager=e,
                    one_at_a_time=True, tree=tree_of(durabilities[0]),
                ).gaps  # fmt: skip
    report(
        Measured(durabilities, configs, label, ratios, rates, trips, gaps, idle, args.idle_runs,
                 stalls, cpu, noop_cpu_ms, rewrites)
    )  # fmt: skip


@dataclass
class Measured:
    durabilities: list[str]
    configs: list[Config]  # (durability, eager turns, broker); the first is the base
    label: dict[Config, str]
    ratios: list[float]
    rates: dict[Config, list[float]]
    trips: dict[Config, list[tuple[float, float]]]
    gaps: dict[Config, dict[str, list[float]]]
    idle: dict[str, dict[str, list[float]]]
    idle_runs: int
    stalls: dict[Config, list[float]]  # per round, the longest a slot stood free unused (s)
    cpu: dict[Config, list[float]]  # per round, the workers' CPU ms per turn
    noop_cpu_ms: list[float]  # per round, the no-op workers' CPU ms per task
    rewrites: dict[Config, list[int]]  # per round, the servers' AOF rewrites under way


def report(m: Measured) -> None:
    print(f"median ratio ({m.label[m.configs[0]]} over the no-op chain) "
          f"{statistics.median(m.ratios):.2f} (goal >= 1.0)")  # fmt: skip
    base = m.configs[0]
    print(f"no-op chain: {statistics.median(m.noop_cpu_ms):.2f} ms worker CPU per task; "
          f"{m.label[base]}'s CPU per turn over it: median "
          f"{statistics.median(t / n for t, n in zip(m.cpu[base], m.noop_cpu_ms, strict=True)):.2f}"
          )  # fmt: skip
    for c in m.configs:
        steps = statistics.median(t[0] for t in m.trips[c])
        tools = statistics.median(t[1] for t in m.trips[c])
        line = (
            f"{m.label[c]}: median {statistics.median(m.rates[c]):.1f} turns/s, "
            f"{statistics.median(m.cpu[c]):.2f} ms worker CPU per turn (goal <= 1.2); store round"
            f" trips per turn {steps:.2f} (goal <= 1.6), the job's tools' {tools:.2f}; "
            f"longest a slot stood free, the worker idle, {max(m.stalls[c]):.3f} s (goal <= 0.2;"
            f" per round"
            f" {', '.join(f'{x:.3f}' for x in m.stalls[c])})"
        )
        if any(m.rewrites[c]):  # a forked child on the same cores: that round reads low
            line += f"; AOF rewrites under way, per round: {m.rewrites[c]}"
        if c != base:
            per_round = [r / b for r, b in zip(m.rates[c], m.rates[base], strict=True)]
            line += (
                f"; over {m.label[base]}: median {statistics.median(per_round):.2f} "
                f"(per round: {', '.join(f'{x:.2f}' for x in per_round)})"
            )
        print(line)  # fmt: skip
    for c in m.configs:
        # The aof goal compares like with like: each durability over none at the same eager.
        none = (m.durabilities[0], c[1], c[2], c[3])
        if c[0] != m.durabilities[0] and none in m.rates:
            per_round = [r / b for r, b in zip(m.rates[c], m.rates[none], strict=True)]
            print(f"{m.label[c]} over {m.label[none]}: median {statistics.median(per_round):.2f} "
                  f"(per round: {', '.join(f'{x:.2f}' for x in per_round)})")  # fmt: skip
    for c in m.configs:
        # RabbitMQ over Redis as the broker, the same setting, round by round.
        redis_broker = (c[0], c[1], "redis", c[3])
        if c[2] == "amqp" and redis_broker in m.rates:
            per_round = [r / b for r, b in zip(m.rates[c], m.rates[redis_broker], strict=True)]
            print(f"RabbitMQ/Redis broker, {c[0]} eager {c[1]}, {c[3]} store: median "
                  f"{statistics.median(per_round):.2f} turns/s ratio "
                  f"(per round: {', '.join(f'{x:.2f}' for x in per_round)})")  # fmt: skip
    for c in m.configs:
        # The cluster store (with either broker) over the single server with the Redis broker.
        single = (c[0], c[1], "redis", "single")
        if c[3] == "cluster" and single in m.rates:
            per_round = [r / b for r, b in zip(m.rates[c], m.rates[single], strict=True)]
            print(f"cluster store, {c[2]} broker, over single server, redis broker, {c[0]} eager "
                  f"{c[1]}: median {statistics.median(per_round):.2f} turns/s ratio "
                  f"(per round: {', '.join(f'{x:.2f}' for x in per_round)})")  # fmt: skip
    for c in m.configs:
        print(gap_line(f"under load, {m.label[c]}", m.gaps[c]))
    for e, g in m.idle.items():
        print(gap_line(f"idle ({m.idle_runs} runs one at a time), "
                       f"{m.durabilities[0]} eager {e}", g))  # fmt: skip


if __name__ == "__main__":
    main()
