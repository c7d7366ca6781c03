"""The chaos drill: every row of the failure table (docs/concepts.md) at once, on one server of
the test's own (AOF on, so a restart keeps the data), in under two minutes.

150 support runs of three tenants on three worker processes (two pool processes each, one
worker sending every step message twice). Every 1 to 3 s (seeded) a worker is SIGKILLed and
replaced, and a run of the third tenant is cancelled; along the way the server is restarted
twice, the first tenant is paused and resumed, and malformed entries are pushed onto the
queue. Afterwards every run has ended exactly once, no order was refunded twice, no worker
exited but the ones killed, and each tenant's ledger holds exactly what its runs recorded.
"""

from __future__ import annotations

import base64
import random
import time
from collections import Counter
from collections.abc import Callable, Iterator

import pytest

from tests.integration.workers import WorkerProcess, client_for, shop_effects, stop_all, wait_until
from turnstile.errors import DecisionRefusedError
from turnstile.jobs.support.scenarios import BY_LETTER, GOAL, USER
from turnstile.worker.broker import deadletters, layout
from turnstile.worker.broker.message import STEP_TASK
from turnstile.worker.broker.producer import producer
from turnstile.worker.client._client import Client
from turnstile.worker.dev.embedded import EmbeddedServer
from turnstile.worker.ops import flags
from turnstile.worker.ops.subjects import Subject
from turnstile.worker.settings import Settings

# About a minute and a half of kills and restarts: run apart from the fast part (pyproject).
pytestmark = [pytest.mark.integration, pytest.mark.slow]

SEED = 20261130
RUNS = 150
LETTERS = "ABCFA"  # end on their own; A and F refund, so a refund replayed twice would show
SLOW = {"sleep_s": {"get_order": 0.4, "issue_refund": 0.3, "send_status_email": 0.4}}
DUPLICATING = {"TURNSTILE_CHAOS_SEND_COPIES": "2"}
CHAOS_S = 50.0  # kills go on this long at most (they stop early once every run has ended)
DIMENSIONS = ("steps", "tool_calls", "tokens", "cost_microusd")
MALFORMED = (
    b"\x00\x01 this is not a message",
    b'{"nope": 1}',
    b'{"body": "%%% not base64", "content-encoding": "utf-8", '
    b'"content-type": "application/json", "headers": {}, "properties": {}}',
)


@pytest.fixture
def durable_server() -> Iterator[EmbeddedServer]:
    with EmbeddedServer(appendonly=True) as server:
        yield server


class Drill:
    """The workers, the runs and the faults, driven from the test's own thread."""

    def __init__(self, server: EmbeddedServer, unique: str) -> None:
        self.server, self.unique = server, unique
        self.queue = f"chaos-{unique}"
        self.rng = random.Random(SEED)
        self.tenants = [f"{name}-{unique}" for name in ("paused", "plain", "cancelled")]
        self.workers: list[WorkerProcess] = []
        self.extra: dict[int, dict[str, str]] = {}
        self.killed: set[int] = set()
        self.gone: set[int] = set()  # exited on their own
        self.exits: list[str] = []
        self.runs: dict[str, str] = {}  # run id -> tenant
        self.log: list[str] = []
        self.client = client_for(server.url)

    # -- workers ---------------------------------------------------------------------------

    def start_worker(self, extra: dict[str, str]) -> WorkerProcess:
        name = f"chaos{len(self.workers)}-{self.unique}"
        worker = WorkerProcess(self.server.url, [self.queue], name=name, env=extra, concurrency=2)
        self.workers.append(worker.start())
        self.extra[id(worker)] = extra
        return worker

    def live(self) -> list[WorkerProcess]:
        """The workers the drill has not killed or seen exit."""
        return [w for w in self.workers if id(w) not in self.killed and id(w) not in self.gone]

    def note_exits(self) -> None:
        """A worker that exited without being killed is a failure: noted with its log's
        tail, and replaced so that the drill goes on with three."""
        for worker in self.live():
            if worker.process is not None and worker.process.poll() is not None:
                self.gone.add(id(worker))
                self.exits.append(f"{worker.name} exited: {worker.log()[-1500:]}")
                self.start_worker(self.extra[id(worker)])

    def kill_one(self) -> None:
        self.note_exits()
        victim = self.rng.choice(self.live())
        victim.kill()
        self.killed.add(id(victim))
        self.start_worker(self.extra[id(victim)])
        self.log.append(f"killed {victim.name}")

    # -- faults ----------------------------------------------------------------------------

    def restart_store(self) -> None:
        self.server.stop()
        self.server.start()
        self.client = client_for(self.server.url)
        self.log.append("store restarted")

    def cancel_one(self) -> None:
        tenant = self.tenants[2]
        live = [r for r, t in self.runs.items() if t == tenant and self._status(r) == "running"]
        if not live:
            return
        run_id = self.rng.choice(sorted(live))
        try:
            self.log.append(f"cancel {run_id}: {self.client.cancel(run_id, by='chaos')}")
        except DecisionRefusedError:
            self.log.append(f"cancel {run_id}: it had ended")

    def malformed(self) -> None:
        for entry in MALFORMED:
            self.client.client.lpush(layout.broker_queue(self.queue), entry)
        producer(Settings(redis_url=self.server.url)).send_task(
            STEP_TASK,
            kwargs={"tenant": self.tenants[1], "run_id": "run_nobody", "version": 1,
                    "queue": self.queue},
            queue=self.queue,
        )  # fmt: skip
        self.log.append("malformed entries pushed")

    def pause(self) -> None:
        flags.pause(self.client, Subject(tenant=self.tenants[0]), by="chaos")
        self.log.append("paused")

    def resume(self) -> None:
        done = flags.resume(self.client, Subject(tenant=self.tenants[0]), by="chaos")
        self.log.append(f"resumed {len(done.resumed)}")

    # -- runs ------------------------------------------------------------------------------

    def submit_all(self) -> None:
        for i in range(RUNS):
            scenario = BY_LETTER[LETTERS[i % len(LETTERS)]]
            tenant = self.tenants[i % len(self.tenants)]
            run_id = self.client.submit(
                tenant, USER, "support", GOAL, {**scenario.params, **SLOW},
                budget=scenario.budget, queue=self.queue,
            )  # fmt: skip
            self.runs[run_id] = tenant

    def _status(self, run_id: str) -> str:
        return self.client.run_hash(run_id, self.runs[run_id])[1]["status"]

    def all_ended(self) -> bool:
        return all(self._status(r) == "stopped" for r in self.runs)

    # -- the drill -------------------------------------------------------------------------

    def run(self) -> None:
        """Kill a worker every 1-3 s and cancel a run after it; on given ticks, the other
        faults. Stops once the scheduled faults are done and every run has ended."""
        scheduled: dict[int, Callable[[], None]] = {
            1: self.malformed, 2: self.restart_store, 3: self.pause, 5: self.resume,
            6: self.malformed, 7: self.restart_store,
        }  # fmt: skip
        started = time.monotonic()
        tick = 0
        while tick <= max(scheduled) or not self.all_ended():
            if time.monotonic() - started > CHAOS_S:
                break
            pause_s = self.rng.uniform(1.0, 3.0)
            deadline = time.monotonic() + pause_s
            while time.monotonic() < deadline:  # watch for exits while waiting for the tick
                self.note_exits()
                time.sleep(0.1)
            tick += 1
            self.kill_one()
            self.cancel_one()
            if tick in scheduled:
                scheduled[tick]()


def _run_problems(client: Client, tenant: str, run_id: str) -> list[str]:
    """The run ended once, each version was committed by one turn, no order refunded twice."""
    stream = [e for _, e in client.store.events(tenant, run_id)]
    problems = []
    finished = [e["type"] for e in stream].count("finished")
    if finished != 1:
        problems.append(f"{run_id}: {finished} finished events")
    versions = [e["version"] for e in stream if e["type"] == "turn"]
    if len(versions) != len(set(versions)):
        problems.append(f"{run_id}: a version committed twice: {versions}")
    refunds = Counter(e[1] for e in shop_effects(client, run_id) if e[0] == "refund")
    if any(n > 1 for n in refunds.values()):
        problems.append(f"{run_id}: refunded twice: {dict(refunds)}")
    return problems


def _ledger_problems(client: Client, tenant: str, runs: list[str]) -> list[str]:
    """The tenant's committed totals are its runs' recorded usage, and nothing is held."""
    states = [client.state(r, tenant) for r in runs]
    ledger = client.ledger.read(tenant)
    problems = []
    for dim in DIMENSIONS:
        recorded = sum(getattr(s.usage, dim) for s in states)
        row = ledger.get(dim)
        committed, reserved = (row.committed, row.reserved) if row else (0, 0)
        if (committed, reserved) != (recorded, 0):
            problems.append(
                f"{tenant} {dim}: committed {committed}, reserved {reserved}; the runs recorded "
                f"{recorded}; {_unsettled(client, tenant)}"
            )
    return problems


def _unsettled(client: Client, tenant: str) -> dict[str, list[str]]:
    """For a failure message: the reservations the ledger charged by expiry (and no settle
    corrected), and the ones still pending."""
    resolved: dict[str, str] = {}
    for entry in client.ledger.journal(tenant):
        if entry.op != "reserve" and not entry.fields.get("corrects"):
            resolved[entry.id] = entry.op
        elif entry.op == "reserve":
            resolved.setdefault(entry.id, "pending")
    return {
        "expired": sorted(i for i, op in resolved.items() if op == "expire"),
        "pending": sorted(i for i, op in resolved.items() if op == "pending"),
    }


def test_chaos(durable_server: EmbeddedServer, unique: str) -> None:
    """Under kills, restarts, a pause, cancels, duplicates and junk on the queue, every run
    ends exactly once, nothing is refunded twice, no worker exits by itself, each tenant's
    committed ledger totals equal the sum of its runs' recorded usage, and every junk entry is
    in the queue's dead letters."""
    drill = Drill(durable_server, unique)
    try:
        for extra in (DUPLICATING, {}, {}):
            drill.start_worker(extra)
        for worker in drill.workers:
            worker.wait_ready()
        drill.submit_all()
        drill.run()
        wait_until(drill.all_ended, timeout_s=75, what=f"every run ends; {drill.log}")
        drill.note_exits()
    finally:
        stop_all(drill.live(), timeout_s=10)
    assert sum("killed" in line for line in drill.log) >= 8, drill.log
    assert drill.log.count("store restarted") == 2, drill.log
    client = client_for(durable_server.url)
    # Every invariant is checked and every breach reported together.
    problems = list(drill.exits)
    for run_id, tenant in drill.runs.items():
        problems += _run_problems(client, tenant, run_id)
    for tenant in drill.tenants:
        problems += _ledger_problems(
            client, tenant, [r for r, t in drill.runs.items() if t == tenant]
        )
    # Eager continuation was on (the default) for the two workers that do not duplicate: some
    # turns ran from their commit's claim, under the same kills and restarts.
    eager = sum(
        1
        for run_id, tenant in drill.runs.items()
        for _, e in client.store.events(tenant, run_id)
        if e["type"] == "turn" and e.get("eager")
    )
    if not eager:
        problems.append("no turn ran from a claim: eager continuation was not exercised")
    kept = [_raw_bytes(letter) for letter in deadletters.listing(client.client, drill.queue, 1000)]
    problems += [f"not in the dead letters: {entry!r}" for entry in MALFORMED if entry not in kept]
    assert problems == [], "\n".join(problems)


def _raw_bytes(letter: deadletters.DeadLetter) -> bytes:
    if letter.raw_encoding == "base64":
        return base64.b64decode(letter.raw)
    return letter.raw.encode("utf-8", "surrogateescape")
