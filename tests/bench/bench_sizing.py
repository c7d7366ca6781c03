"""Benchmark: the figures deploy/SIZING.md is computed from, per turn and per run of the support
job at zero model and tool latency, measured on the servers themselves.

    uv run python -m tests.bench.bench_sizing [--runs 200] [--tenants 10] [--idle-s 5]
        [--pool prefork|gevent] [--concurrency 1] [--eager 8]

Two Valkey servers as a split deployment has them: the store (and ledger) with AOF fsynced
always and TURNSTILE_DURABILITY=aof, as deploy/k8s runs it, and the broker; two worker
processes. The workers start and idle for `--idle-s` (their background: the broker polls, the
sweeper, the dispatcher, the heartbeats); then `--runs` runs, spread over `--tenants`
tenants, are submitted at once and the measure runs to the last one's end. Read before and
after, on each server:
  - INFO commandstats: the commands the server ran, those called inside Lua scripts included
    (so a script is its EVALSHA and every redis.call in it): the server's work;
  - INFO stats total_net_input_bytes / total_net_output_bytes: the network;
  - INFO cpu used_cpu_user + used_cpu_sys: the server's CPU (a Valkey shard's commands run on
    one thread, so this bounds the turns/s one shard can carry);
  - INFO memory used_memory: the store's memory per finished run kept (retention removes a
    run TURNSTILE_RETAIN_FINISHED_S after it ends, 3 days by default; nothing expires here),
    and after the runs every key's MEMORY USAGE (exact: SAMPLES 0), grouped by the key's shape;
and the worker processes' CPU time and memory (main and pool processes, from /proc through
psutil). A sampler reads the queue's broker lists, kombu's unacked hash and the tenants'
pending lists every 0.25 s (its commands are taken out of the counts; its bytes are not,
about 1 % of them) to show where a backlog waits. The job's tools keep the demo shop in the
store too: their client round trips are shown apart, their commands are in the store's.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import redis

from tests.bench import bench_worker
from tests.bench.bench_worker import ZERO_LATENCY, _env, _stop, _workers
from turnstile.jobs.support.scenarios import GOAL, USER
from turnstile.worker.broker.layout import priority_lists
from turnstile.worker.broker.producer import sender
from turnstile.worker.client._client import Client
from turnstile.worker.dev.embedded import EmbeddedServer
from turnstile.worker.settings import Settings
from turnstile.worker.store import keys
from turnstile.worker.store.connect import connect
from turnstile.worker.store.durability import Durability

SAMPLE_S = 0.25
WORKERS = 2
UNACKED = "unacked"  # kombu's Redis transport: delivered, not yet acked


@dataclass
class Snapshot:
    """What one server says of itself at one moment."""

    commands: Counter[str]
    net_in: int
    net_out: int
    cpu_s: float  # the server process's, its background threads (the AOF's fsync) included
    main_cpu_s: float  # its main thread's, the one that runs every command
    used_memory: int

    @classmethod
    def of(cls, client: redis.Redis) -> Snapshot:
        stats = client.info("commandstats")
        commands = Counter({k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()})
        info = client.info("stats") | client.info("cpu") | client.info("memory")
        return cls(
            commands, int(info["total_net_input_bytes"]), int(info["total_net_output_bytes"]),
            float(info["used_cpu_user"]) + float(info["used_cpu_sys"]),
            float(info["used_cpu_user_main_thread"]) + float(info["used_cpu_sys_main_thread"]),
            int(info["used_memory"]),
        )  # fmt: skip

    def minus(self, before: Snapshot, taken: Counter[str]) -> Snapshot:
        """What happened between `before` and this, less the commands `taken` (the sampler's,
        and the INFO calls that read the snapshots)."""
        commands = self.commands.copy()
        commands.subtract(before.commands)
        commands.subtract(taken)
        return Snapshot(
            +commands, self.net_in - before.net_in, self.net_out - before.net_out,
            self.cpu_s - before.cpu_s, self.main_cpu_s - before.main_cpu_s,
            self.used_memory - before.used_memory,
        )  # fmt: skip


def worker_cpu_s(procs: list[Any]) -> float:
    """CPU seconds of the workers' processes, their pool processes included."""
    total = 0.0
    for p in procs:
        try:
            main = psutil.Process(p.pid)
            for proc in [main, *main.children(recursive=True)]:
                times = proc.cpu_times()
                total += times.user + times.system
        except psutil.NoSuchProcess:
            continue
    return total


def worker_memory(procs: list[Any]) -> tuple[int, int, int]:
    """(processes, summed USS, summed RSS) of the workers' process trees, in bytes: USS is what
    each process alone holds (its pages shared with the others not counted)."""
    count = uss = rss = 0
    for p in procs:
        main = psutil.Process(p.pid)
        for proc in [main, *main.children(recursive=True)]:
            mem = proc.memory_full_info()
            count, uss, rss = count + 1, uss + mem.uss, rss + mem.rss
    return count, uss, rss


@dataclass
class Sampler:
    """Where the queue's steps wait, every SAMPLE_S: on the broker's lists, in kombu's unacked
    hash (held by a worker), in the tenants' pending lists (fair share's, in the store)."""

    broker: redis.Redis
    store: redis.Redis
    queue: str
    tenants: list[str]
    samples: list[tuple[int, int, int]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def broker_commands(self) -> Counter[str]:
        n = len(self.samples)
        return Counter({"llen": n * len(priority_lists(self.queue)), "hlen": n})

    def store_commands(self) -> Counter[str]:
        return Counter({"llen": len(self.samples) * 2 * len(self.tenants)})

    def loop(self) -> None:
        while not self.stop.wait(SAMPLE_S):
            pipe = self.broker.pipeline(transaction=False)
            for name in priority_lists(self.queue):
                pipe.llen(name)
            pipe.hlen(UNACKED)
            *lists, unacked = pipe.execute()
            pipe = self.store.pipeline(transaction=False)
            for tenant in self.tenants:
                for kind in ("cont", "start"):
                    pipe.zcard(keys.pending(tenant, self.queue, kind))
            pending = sum(int(n) for n in pipe.execute())
            self.samples.append((sum(int(n) for n in lists), int(unacked), pending))


INFO_CALLS = Counter({"info": 4})  # a Snapshot reads INFO four times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--tenants", type=int, default=10)
    parser.add_argument("--idle-s", type=float, default=5.0)
    parser.add_argument("--pool", choices=["prefork", "gevent"], default="prefork")
    parser.add_argument("--concurrency", type=int, default=1, help="per worker process")
    parser.add_argument("--eager", default="8", help="TURNSTILE_EAGER_TURNS")
    args = parser.parse_args()
    bench_worker.POOL[:] = [args.pool, str(args.concurrency)]
    work = Path(tempfile.mkdtemp(prefix="turnstile-sizing-"))
    queue = f"z-{uuid.uuid4().hex[:6]}"
    tenants = [f"size{i}-{uuid.uuid4().hex[:4]}" for i in range(args.tenants)]
    with (
        EmbeddedServer(appendonly=True) as store_server,
        EmbeddedServer(appendonly=True, appendfsync="everysec") as broker_server,
    ):
        config = Settings(
            redis_url=store_server.url, broker_url=broker_server.url, durability=Durability.AOF
        )
        store, broker = (
            redis.Redis.from_url(store_server.url),
            redis.Redis.from_url(broker_server.url),
        )
        client = Client(connect(store_server.url, config), config, sender(config))
        env = _env(broker_server.url, store_server.url, work, store_server.port,
                   durability="aof", eager=args.eager)  # fmt: skip
        procs = _workers("turnstile.worker.runtime.app:app", queue, env, WORKERS, work / "w.log")
        sampler = Sampler(broker, store, queue, tenants)
        try:
            idle0 = Snapshot.of(store), Snapshot.of(broker)
            time.sleep(args.idle_s)
            idle1 = Snapshot.of(store), Snapshot.of(broker)
            idle = [a.minus(b, INFO_CALLS) for a, b in zip(idle1, idle0, strict=True)]
            before = Snapshot.of(store), Snapshot.of(broker)
            cpu0 = worker_cpu_s(procs)
            started = time.perf_counter()
            threading.Thread(target=sampler.loop, daemon=True).start()
            for i in range(args.runs):
                client.submit(tenants[i % len(tenants)], USER, "support", GOAL, ZERO_LATENCY,
                              queue=queue)  # fmt: skip
            stopped = [keys.by_status(t, "stopped") for t in tenants]
            polls = 0  # the waits' SCARDs, taken out of the store's count
            while sum(int(store.scard(k)) for k in stopped) < args.runs:
                polls += len(stopped)
                time.sleep(0.1)
            polls += len(stopped)
            seconds = time.perf_counter() - started
            sampler.stop.set()
            time.sleep(2 * SAMPLE_S)
            cpu1 = worker_cpu_s(procs)
            after = Snapshot.of(store), Snapshot.of(broker)
            memory = worker_memory(procs)
        finally:
            sampler.stop.set()
            _stop(procs)
        load = (
            after[0].minus(before[0], INFO_CALLS + sampler.store_commands() + Counter(scard=polls)),
            after[1].minus(before[1], INFO_CALLS + sampler.broker_commands()),
        )
        turns = 0
        for tenant in tenants:
            for run_id in client.client.zrange(keys.runs(tenant), 0, -1):
                state = json.loads(str(client.client.hget(keys.run(tenant, str(run_id)), "state")))
                turns += state["usage"]["steps"]
        trips = [json.loads(p.read_text()) for p in work.glob("*.json")]
        groups = key_groups(store, tenants, client)
    report(Measured(args, seconds, turns, idle, load, cpu1 - cpu0, memory, trips,
                    sampler, groups))  # fmt: skip


def key_groups(store: redis.Redis, tenants: list[str], client: Client) -> dict[str, list[int]]:
    """Every key of the store, by its shape (the tenant's tag and the run id taken out):
    [keys, MEMORY USAGE bytes summed (the values, the key and the server's per-key overhead),
    entries of the streams among them]."""
    run_ids = {
        str(r) for t in tenants for r in client.client.zrange(keys.runs(t), 0, -1)
    }  # fmt: skip
    groups: dict[str, list[int]] = {}
    for raw in store.scan_iter(count=1000):
        name = raw.decode(errors="replace")
        shape = name
        for tenant in tenants:
            shape = shape.replace("{" + tenant + "}", "{T}")
        for part in shape.split(":"):
            if part in run_ids:
                shape = shape.replace(part, "<run>")
        group = groups.setdefault(shape, [0, 0, 0])
        group[0] += 1
        group[1] += int(store.memory_usage(raw, samples=0) or 0)
        if store.type(raw) == b"stream":
            group[2] += int(store.xlen(raw))
    return groups


@dataclass
class Measured:
    args: argparse.Namespace
    seconds: float
    turns: int
    idle: list[Snapshot]  # store, broker: the idle window
    load: tuple[Snapshot, Snapshot]  # store, broker: the runs
    worker_cpu: float
    memory: tuple[int, int, int]  # the workers' processes, USS, RSS
    trips: list[dict[str, Any]]  # the counted workers' round trips
    sampler: Sampler
    groups: dict[str, list[int]]  # the store's keys by shape: [count, bytes, stream entries]


def report(m: Measured) -> None:
    args, turns, runs = m.args, m.turns, m.args.runs
    print(f"{runs} runs, {turns} turns ({turns / runs:.1f} a run) in {m.seconds:.1f} s: "
          f"{turns / m.seconds:.1f} turns/s on {WORKERS} workers x {args.pool} "
          f"{args.concurrency}, eager {args.eager}, {args.tenants} tenants")  # fmt: skip
    print(f"workers: {m.worker_cpu:.2f} CPU s, {m.worker_cpu / turns * 1000:.2f} ms CPU a turn "
          f"({turns / m.worker_cpu:.0f} turns/s per busy core); "
          f"{m.memory[0]} processes, USS {m.memory[1] / 2**20:.0f} MiB, "
          f"RSS {m.memory[2] / 2**20:.0f} MiB")  # fmt: skip
    step = sum(t["round_trips"] for t in m.trips) / turns
    tool = sum(t["tool_round_trips"] for t in m.trips) / turns
    print(f"client round trips to the store a turn: steps {step:.2f}, the job's tools {tool:.2f}")
    for name, snap, base in (("store", m.load[0], m.idle[0]), ("broker", m.load[1], m.idle[1])):
        total = sum(snap.commands.values())
        top = ", ".join(f"{k} {v / turns:.2f}" for k, v in snap.commands.most_common(8))
        per_core = turns / snap.main_cpu_s if snap.main_cpu_s else float("inf")
        print(f"{name}: {total / turns:.1f} commands a turn ({top}); "
              f"in {snap.net_in / turns:.0f} B, out {snap.net_out / turns:.0f} B a turn; "
              f"CPU a turn: main thread {snap.main_cpu_s / turns * 1e6:.0f} us "
              f"({per_core:.0f} turns/s at 100 % of it), process "
              f"{snap.cpu_s / turns * 1e6:.0f} us")  # fmt: skip
        idle_cmds = sum(base.commands.values()) / args.idle_s / WORKERS
        print(f"{name} idle, per worker: {idle_cmds:.1f} commands/s, "
              f"{(base.net_in + base.net_out) / args.idle_s / WORKERS:.0f} B/s")  # fmt: skip
    print(
        f"store memory: {m.load[0].used_memory / runs:.0f} B a finished run kept "
        f"(used_memory {m.load[0].used_memory / 2**20:.1f} MiB more after {runs} runs)"
    )
    print("the store's keys after the runs, by shape: keys, bytes a run (stream entries a run)")
    for shape, (count, size, entries) in sorted(m.groups.items(), key=lambda g: -g[1][1])[:12]:
        more = f" ({entries / runs:.1f} entries, {size / entries:.0f} B each)" if entries else ""
        print(f"  {shape:<48} {count:>6} {size / runs:>9.0f}{more}")
    if m.sampler.samples:
        waiting = [s[0] for s in m.sampler.samples]
        unacked = [s[1] for s in m.sampler.samples]
        pending = [s[2] for s in m.sampler.samples]
        print(f"where the backlog waited ({len(waiting)} samples): broker lists max "
              f"{max(waiting)} mean {sum(waiting) / len(waiting):.1f}; unacked max "
              f"{max(unacked)}; pending lists max {max(pending)} mean "
              f"{sum(pending) / len(pending):.1f}")  # fmt: skip
    print(f"command: uv run python -m tests.bench.bench_sizing --runs {runs} --tenants "
          f"{args.tenants} --idle-s {args.idle_s:g} --pool {args.pool} --concurrency "
          f"{args.concurrency} --eager {args.eager}")  # fmt: skip


if __name__ == "__main__":
    main()
