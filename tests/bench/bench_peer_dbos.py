"""Benchmark: DBOS, the peer ahead when durable, on the same machine and in the same run as
Turnstile: a durable step of DBOS's against a turn of Turnstile's.

    uv run --with dbos==3.4.0 python -m tests.bench.bench_peer_dbos [--runs 300] [--rounds 3]
        [--concurrency 20] [--modes queue,direct,async] [--pg postgresql://postgres@127.0.0.1:5432]
        [--turnstile "--durability none,aof --pool gevent --concurrency 20 --eager 8 --idle-runs 0"]

DBOS is not one of Turnstile's dependencies: `uv run --with` adds it for this command only (the
lock is untouched), and the bench needs a PostgreSQL server it may create a database on
(`--pg`; this machine's runs on 127.0.0.1:5432). Each DBOS run is a workflow of five steps, each
step a trivial function (the state passed in, a new state returned), so DBOS's figure is the
cost of its durability and scheduling alone, at its best; Turnstile's turn runs the whole
support job (a model call to the built-in scripted model, its tools, its ledger holds).

Per round, in turn on the same machine state: each DBOS mode on a new database, then one
round of bench_worker with the `--turnstile` arguments (its runs and round count are this
bench's). Two executor processes, as Turnstile's two workers:
- `queue`: the runs enqueued first on a DBOS queue (`DBOSClient.enqueue`), taken by the two
  executors (worker_concurrency `--concurrency` each, polled every 10 ms);
- `direct`: each executor starts half the runs itself (`DBOS.start_workflow`), no queue;
- `async`: `direct` with the database's `synchronous_commit off` (a commit does not wait for
  the WAL flush): DBOS without its durability, for DBOS's own durable-over-not ratio.
Printed per round: steps a second for each mode (from the first workflow's start to the last
one's end, as the system database records them), the executors' and PostgreSQL's CPU per step,
then Turnstile's figures and each Turnstile setting over each DBOS mode.
"""

from __future__ import annotations

import argparse
import re
import shlex
import subprocess
import sys
import time
import uuid
from typing import Any

import psutil

try:
    import psycopg
    from dbos import DBOS, DBOSClient, DBOSConfig, EnqueueOptions
except ImportError:
    sys.exit(
        "bench_peer_dbos needs DBOS, which is not one of Turnstile's dependencies: "
        "uv run --with dbos==3.4.0 python -m tests.bench.bench_peer_dbos"
    )

STEPS = 5  # a run's durable steps, as a support run's turns
QUEUE = "bench"
POLL_S = 0.01


def executor(name: str, url: str, concurrency: int) -> None:
    """One DBOS executor process: says `ready`, then runs what its queue holds; a line with a
    count on stdin starts that many workflows here instead. Ends when stdin closes."""
    config: DBOSConfig = {
        "name": "turnstile-peer-bench", "system_database_url": url, "executor_id": name,
        "log_level": "WARNING", "sys_db_pool_size": max(20, 2 * concurrency),
    }  # fmt: skip
    DBOS(config=config)

    @DBOS.step(name="turn")  # type: ignore[untyped-decorator]  # DBOS: `uv run --with`
    def turn(state: dict[str, Any], i: int) -> dict[str, Any]:
        return {**state, "turns": i + 1, "last": f"turn {i}"}

    @DBOS.workflow(name="run")  # type: ignore[untyped-decorator]
    def run(goal: str) -> dict[str, Any]:
        state: dict[str, Any] = {"goal": goal, "turns": 0}
        for i in range(STEPS):
            state = turn(state, i)
        return state

    DBOS.launch()
    DBOS.register_queue(QUEUE, worker_concurrency=concurrency, polling_interval_sec=POLL_S)
    print("ready", flush=True)
    line = sys.stdin.readline().strip()
    if line:
        handles = [DBOS.start_workflow(run, f"goal {i}") for i in range(int(line))]
        for handle in handles:
            handle.get_result()
    sys.stdin.read()
    DBOS.destroy()


def _postgres_cpu_s() -> float:
    total = 0.0
    for proc in psutil.process_iter(["name"]):
        try:
            if (proc.info["name"] or "").startswith("postgres"):
                times = proc.cpu_times()
                total += times.user + times.system
        except psutil.Error:
            continue
    return total


def dbos_round(pg: str, mode: str, runs: int, concurrency: int) -> dict[str, float]:
    """One round of one mode on a database of its own, dropped after."""
    db = f"turnstile_peer_{uuid.uuid4().hex[:8]}"
    try:
        admin = psycopg.connect(f"{pg}/postgres", autocommit=True)
    except psycopg.OperationalError as exc:
        sys.exit(f"bench_peer_dbos needs a PostgreSQL server it may create databases on "
                 f"(--pg {pg}): {str(exc).strip().splitlines()[0]}")  # fmt: skip
    with admin:
        admin.execute(f"CREATE DATABASE {db}")
        if mode == "async":
            admin.execute(f"ALTER DATABASE {db} SET synchronous_commit TO off")
    url = f"{pg}/{db}"
    args = [sys.executable, "-m", "tests.bench.bench_peer_dbos", "--executor"]
    try:
        setup = subprocess.Popen([*args, "setup", url, "1"], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE)  # fmt: skip
        _ready(setup)  # it creates DBOS's tables, alone
        setup.communicate(timeout=60)
        if mode == "queue":
            client = DBOSClient(system_database_url=url)
            options: EnqueueOptions = {"queue_name": QUEUE, "workflow_name": "run"}
            for i in range(runs):
                client.enqueue(options, f"goal {i}")
            client.destroy()
        procs = [
            subprocess.Popen(
                [*args, f"e{i}", url, str(concurrency)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
            )
            for i in range(2)
        ]
        for proc in procs:
            _ready(proc)
        cpu = [psutil.Process(p.pid) for p in procs]
        work0 = sum(sum(c.cpu_times()[:2]) for c in cpu)
        pg0 = _postgres_cpu_s()
        if mode != "queue":
            for proc in procs:
                assert proc.stdin is not None
                proc.stdin.write(f"{runs // 2}\n".encode())
                proc.stdin.flush()
        with psycopg.connect(url, autocommit=True) as conn:
            while True:
                row = conn.execute(
                    "SELECT count(*) FROM dbos.workflow_status WHERE status = 'SUCCESS'"
                ).fetchone()
                if row is not None and row[0] >= runs - runs % 2:
                    break
                time.sleep(0.005)
            work1 = sum(sum(c.cpu_times()[:2]) for c in cpu)
            pg1 = _postgres_cpu_s()
            span = conn.execute(
                "SELECT min(coalesce(started_at_epoch_ms, created_at)), max(updated_at) "
                "FROM dbos.workflow_status"
            ).fetchone()
            steps = conn.execute("SELECT count(*) FROM dbos.operation_outputs").fetchone()
        for proc in procs:
            proc.communicate(timeout=60)
    finally:
        with psycopg.connect(f"{pg}/postgres", autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
    assert span is not None and steps is not None
    done = (runs - runs % 2) * STEPS
    return {
        "steps/s": done / ((span[1] - span[0]) / 1000),
        "executor ms": 1000 * (work1 - work0) / done,
        "postgres ms": 1000 * (pg1 - pg0) / done,
        "rows": float(steps[0]),
    }


def _ready(proc: subprocess.Popen[bytes]) -> None:
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != b"ready":
        proc.kill()
        raise RuntimeError("a DBOS executor did not start (see its output above)")


def turnstile_round(args: str, runs: int) -> dict[str, float]:
    """One round of bench_worker; each setting's median turns/s, by its name."""
    cmd = [sys.executable, "-m", "tests.bench.bench_worker", "--runs", str(runs),
           "--rounds", "1", *shlex.split(args)]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    figures: dict[str, float] = {}
    for line in out.splitlines():
        if match := re.match(r"(.+?): median ([\d.]+) turns/s", line):
            figures[match[1]] = float(match[2])
    header = out.splitlines()[0].split()
    row = next(ln for ln in out.splitlines() if ln.split()[:1] == ["1"])
    if "no-op" in header:  # "round <settings...> no-op tasks/s ratio": the no-op's column
        figures["no-op chain"] = float(row.split()[-2])
    return figures


def main() -> None:
    if sys.argv[1:2] == ["--executor"]:
        name, url, concurrency = sys.argv[2:5]
        executor(name, url, int(concurrency))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=20)
    parser.add_argument("--modes", default="queue,direct,async")
    parser.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432")
    parser.add_argument("--turnstile", default="--durability none,aof --pool gevent "
                        "--concurrency 20 --eager 8 --idle-runs 0")  # fmt: skip
    args = parser.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    for r in range(1, args.rounds + 1):
        dbos = {m: dbos_round(args.pg, m, args.runs, args.concurrency) for m in modes}
        for mode, fig in dbos.items():
            print(f"round {r}, DBOS {mode}: {fig['steps/s']:.1f} steps/s, executors "
                  f"{fig['executor ms']:.2f} ms a step, PostgreSQL {fig['postgres ms']:.2f} ms "
                  f"({fig['rows']:.0f} step rows)", flush=True)  # fmt: skip
        ts = turnstile_round(args.turnstile, args.runs) if args.turnstile else {}
        for name, value in ts.items():
            if name == "no-op chain":
                continue
            over = ", ".join(f"over DBOS {m} {value / fig['steps/s']:.2f}"
                             for m, fig in dbos.items())  # fmt: skip
            print(f"round {r}, Turnstile {name}: {value:.1f} turns/s; {over}", flush=True)
        if "no-op chain" in ts:
            over = ", ".join(f"DBOS {m} over it {fig['steps/s'] / ts['no-op chain']:.2f}"
                             for m, fig in dbos.items())  # fmt: skip
            print(f"round {r}, Celery's no-op chain: {ts['no-op chain']:.1f} tasks/s; {over}")
        if "direct" in dbos and "async" in dbos:
            ratio = dbos["direct"]["steps/s"] / dbos["async"]["steps/s"]
            print(f"round {r}, DBOS durable (direct) over synchronous_commit off: {ratio:.2f}")


if __name__ == "__main__":
    main()
