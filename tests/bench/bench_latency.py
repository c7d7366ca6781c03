"""Benchmark: the support job on a model served over HTTP (tests/wire/'s OpenAI wire-format
server) answering each call after `--latency-s`, on prefork at its default concurrency next to
the gevent pool at high concurrency, with 1 and 2 worker processes; and the same gevent
workers with a zero-latency model, for the ratio.

    uv run python -m tests.bench.bench_latency [--runs 1000] [--prefork-runs 40]
        [--concurrency 500] [--latency-s 1.0] [--processes 1,2] [--skip-prefork]
        [--skip-zero] [--leases deployed|tests] [--trees NAME=DIR,...]

Per configuration: turns/s (committed turns over the time from the first submission to the
last run ending), turns in flight (sampled every 0.1 s: mean and peak), and the PSS of all
worker processes and their pool processes (psutil `memory_full_info().pss`, peak), also per
in-flight turn (peak PSS over peak turns in flight), and the CPU time per turn of the workers,
the model's server and the store over the timed window (on one machine they share the cores;
the workers' start-up is left out). Prefork at 1 s
latency turns `concurrency` turns a second at best, so it gets `--prefork-runs` runs, not
`--runs`: its rate is already steady.
With `--trees now=.,before=<checkout>` each configuration runs once per checkout (its workers
from that checkout's .venv), in turn, so two versions are measured side by side on the same
machine state; each line then names its tree.
Goals (issue 12): with 2 processes, gevent's turns/s at 1 s >= 0.8x its turns/s at zero
latency; <= 1 GB PSS for all workers together; <= 2 MB PSS per in-flight turn.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psutil

from tests.bench.bench_worker import parse_trees
from tests.integration.workers import WorkerProcess, client_for
from tests.wire.wire import MODELS, wire_server
from turnstile.jobs.support.scenarios import GOAL, USER
from turnstile.worker.broker.layout import broker_queue
from turnstile.worker.dev.embedded import EmbeddedServer
from turnstile.worker.settings import Settings
from turnstile.worker.store import keys

BUDGET = {"max_tokens": 40_000, "max_tool_calls": 8}
PREFORK_DEFAULT_CONCURRENCY = 2  # `turnstile worker`'s default
# The leases and sweep a deployed worker has (Settings' defaults), in place of the test
# harness's short ones: with thousands of steps queued at once, a 3 s pickup lease lapses
# before the step's turn comes, and the sweeper sends it again (work done twice).
DEPLOYED_LEASES = {
    "TURNSTILE_PICKUP_LEASE_S": str(Settings.model_fields["pickup_lease_s"].default),
    "TURNSTILE_INFLIGHT_LEASE_S": str(Settings.model_fields["inflight_lease_s"].default),
    "TURNSTILE_SWEEP_INTERVAL_S": str(Settings.model_fields["sweep_interval_s"].default),
}


@dataclass
class Figures:
    pool: str
    processes: int
    concurrency: int
    latency_s: float
    runs: int
    turns: int
    seconds: float
    turns_per_s: float
    in_flight_mean: float
    in_flight_peak: int
    pss_peak_mb: float
    pss_per_in_flight_turn_mb: float
    outcomes: dict[str, int]
    # CPU time per turn (ms) spent by the workers, by the model's server, and by the store's:
    # on one machine they share its cores, so where the CPU goes says what caps turns/s.
    cpu_ms_per_turn: dict[str, float]
    # Steps waiting, sampled with the turns in flight (mean): on the queue's broker list (sent
    # by the dispatcher, not yet taken by a worker), and in the tenant's pending sets (not yet
    # sent). A long broker list with slots free: the workers are slow to take steps.
    broker_list_mean: float
    pending_mean: float


def _pss_mb(workers: list[WorkerProcess]) -> float:
    total = 0
    for worker in workers:
        assert worker.process is not None
        try:
            root = psutil.Process(worker.process.pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            continue
        for proc in procs:
            try:
                if "supervise" in " ".join(proc.cmdline()):
                    continue  # the test harness's restarter, not a worker
                total += proc.memory_full_info().pss
            except psutil.NoSuchProcess:
                continue
    return total / 2**20


def _cpu_s() -> dict[str, float]:
    """CPU seconds (user + system) so far of this process's children, by kind."""
    out = {"workers": 0.0, "model server": 0.0, "store": 0.0}
    for proc in psutil.Process().children(recursive=True):
        try:
            line = " ".join(proc.cmdline())
            times = proc.cpu_times()
        except psutil.NoSuchProcess:
            continue
        kind = (
            "model server" if "tests.wire.wire_server" in line
            else "store" if "valkey-server" in line or "redis-server" in line
            else None if "supervise" in line
            else "workers"
        )  # fmt: skip
        if kind is not None:
            out[kind] += times.user + times.system
    return out


def measure(
    pool: str,
    processes: int,
    concurrency: int,
    latency_s: float,
    runs: int,
    *,
    extra: dict[str, str],
    submitted: Callable[[Any, str, str], None] | None = None,
    tree: Path | None = None,
) -> Figures:
    """One configuration on fresh servers: submit `runs` at once, sample until all end (the
    workers from checkout `tree`'s .venv, when given)."""
    with (
        EmbeddedServer() as server,
        wire_server("openai", "support_run", delay_s=latency_s, by_turn=True) as wire,
    ):
        queue, tenant = f"lat-{uuid.uuid4().hex[:8]}", "bench"
        # The harness gives a green worker GREEN_PER_PROCESS turns per process asked for.
        per = concurrency if pool == "prefork" else max(1, concurrency // 50)
        workers = [
            WorkerProcess(server.url, [queue], name=f"lat{i}-{queue}", env={**wire.env, **extra},
                          concurrency=per, pool=pool, tree=tree).start()
            for i in range(processes)
        ]  # fmt: skip
        try:
            for worker in workers:
                worker.wait_ready()
            client = client_for(server.url)
            client.ledger.set_ceiling(tenant, "cost_microusd", 10**12)
            samples: list[int] = []
            waiting: list[tuple[int, int]] = []  # (on the broker list, in the pending sets)
            pss: list[float] = []
            listed = broker_queue(queue)
            sets = [keys.pending(tenant, queue, kind) for kind in ("cont", "start")]
            stop = threading.Event()

            def sample() -> None:
                while not stop.wait(0.1):
                    samples.append(int(client.client.hlen(keys.inflight(tenant))))
                    pipe = client.client.pipeline(transaction=False)
                    pipe.llen(listed)
                    for name in sets:
                        pipe.zcard(name)
                    depth, *held = pipe.execute()
                    waiting.append((int(depth), sum(int(n) for n in held)))
                    if len(samples) % 5 == 0:
                        pss.append(_pss_mb(workers))

            sampler = threading.Thread(target=sample, daemon=True)
            cpu_before = _cpu_s()  # the workers' start-up is not a turn's
            started = time.monotonic()
            sampler.start()
            ids = []
            for _ in range(runs):
                ids.append(client.submit(tenant, USER, "support", GOAL,
                                         {"model": MODELS["openai"]}, budget=BUDGET,
                                         queue=queue))  # fmt: skip
                if submitted is not None:  # e.g. bench_live: the run read live from now on
                    submitted(client, tenant, ids[-1])
            stopped = keys.by_status(tenant, "stopped")  # one read a poll, not one per run
            while int(client.client.scard(stopped)) < runs:
                time.sleep(0.05)
            seconds = time.monotonic() - started
            cpu = {kind: s - cpu_before[kind] for kind, s in _cpu_s().items()}
            stop.set()
            sampler.join()
            states = [client.state(r, tenant) for r in ids]
            turns = sum(s.usage.steps for s in states)
            outcomes = Counter(f"{s.outcome}/{s.detail or ''}" for s in states)
        finally:
            for worker in workers:
                worker.stop(timeout_s=30)
    busy = [s for s in samples if s > 0] or [0]
    queued = waiting[: len(busy)] or [(0, 0)]
    peak = max(busy)
    pss_peak = max(pss, default=0.0)
    return Figures(
        pool,
        processes,
        concurrency,
        latency_s,
        runs,
        turns,
        round(seconds, 2),
        round(turns / seconds, 1),
        round(statistics.mean(busy), 1),
        peak,
        round(pss_peak, 1),
        round(pss_peak / peak, 2) if peak else 0.0,
        dict(outcomes),
        {kind: round(1000 * s / max(1, turns), 2) for kind, s in cpu.items()},
        round(statistics.mean(d for d, _ in queued), 1),
        round(statistics.mean(p for _, p in queued), 1),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--prefork-runs", type=int, default=40)
    parser.add_argument("--concurrency", type=int, default=500)
    parser.add_argument("--latency-s", type=float, default=1.0)
    parser.add_argument("--processes", default="1,2")
    parser.add_argument("--skip-prefork", action="store_true")
    parser.add_argument(
        "--skip-zero", action="store_true", help="no zero-latency gevent run (no ratio)"
    )
    parser.add_argument(
        "--leases", choices=["deployed", "tests"], default="deployed",
        help="the workers' leases and sweep: Settings' defaults, or the tests' short ones",
    )  # fmt: skip
    parser.add_argument(
        "--dispatch-depth", type=int, default=None, help="TURNSTILE_DISPATCH_DEPTH for workers"
    )
    parser.add_argument(
        "--trees", default="",
        help="NAME=DIR,...: run each configuration's workers from these checkouts, in turn",
    )  # fmt: skip
    args = parser.parse_args()
    trees: dict[str, Path | None] = {**parse_trees(args.trees, parser)} or {"": None}
    results: list[dict[str, Any]] = []
    for processes in (int(p) for p in args.processes.split(",")):
        configs = [("gevent", args.concurrency, args.latency_s, args.runs)]
        if not args.skip_zero:
            configs.append(("gevent", args.concurrency, 0.0, args.runs))
        if not args.skip_prefork:
            configs.append(
                ("prefork", PREFORK_DEFAULT_CONCURRENCY, args.latency_s, args.prefork_runs)
            )
        for pool, concurrency, latency_s, runs in configs:
            extra = dict(DEPLOYED_LEASES) if args.leases == "deployed" else {}
            if args.dispatch_depth is not None:
                extra["TURNSTILE_DISPATCH_DEPTH"] = str(args.dispatch_depth)
            for name, tree in trees.items():
                figures = measure(
                    pool, processes, concurrency, latency_s, runs, extra=extra, tree=tree
                )
                results.append({**asdict(figures), "tree": name})
                print(json.dumps(results[-1] if name else asdict(figures)), flush=True)
    for processes, name in {(r["processes"], r["tree"]) for r in results}:
        slow = [
            r for r in results
            if r["processes"] == processes and r["pool"] == "gevent" and r["tree"] == name
        ]  # fmt: skip
        at = {r["latency_s"]: r["turns_per_s"] for r in slow}
        if len(at) == 2 and at.get(0.0):
            ratio = at[args.latency_s] / at[0.0]
            which = f" ({name})" if name else ""
            print(f"{processes} process(es){which}: gevent turns/s at {args.latency_s} s latency "
                  f"/ at zero latency = {ratio:.2f} (goal >= 0.8)")  # fmt: skip


if __name__ == "__main__":
    main()
