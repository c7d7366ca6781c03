"""Budget extensions under chaos: runs that are held `needs_budget` again and again, each hold
approved (or, for every fourth run, denied) by two deciders at once (a duplicated delivery of
the same decision), while workers are SIGKILLed and replaced every second or two and one worker
sends every step message twice. Afterwards every run has ended exactly once, each hold was
decided once, no version was committed twice, and each tenant's ledger holds exactly what its
runs recorded, with nothing left reserved."""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Iterator

import pytest

from tests.budget_jobs import SPEC
from tests.integration.test_chaos import _ledger_problems, _run_problems
from tests.integration.workers import WorkerProcess, client_for, stop_all, wait_until
from turnstile.errors import DecisionRefusedError, RunNotFoundError
from turnstile.worker.client._client import Client

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SEED = 20261202
RUNS = 16
# The drill's kills fall at random, not because a turn kills its worker: a step that three
# of them hit in a row would rightly be judged poison (ended `error`, "delivered 4 times
# without a commit"; 3 drills in 10 on 2 cores), which is not what is tested here.
JOBS = {"TURNSTILE_JOBS": SPEC, "TURNSTILE_MAX_STEP_ATTEMPTS": "50"}
DUPLICATING = {**JOBS, "TURNSTILE_CHAOS_SEND_COPIES": "2"}
PARAMS = {"turns": 8, "sleep_s": 0.3}  # a turn takes real time: kills land inside turns
CHAOS_S = 60.0


class Deciders:
    """Two threads per held run, deciding the same hold at once; every outcome recorded."""

    def __init__(self, client: Client, runs: dict[str, str], stopped: set[str]) -> None:
        self.client, self.runs, self.stopped = client, runs, stopped
        self.done: Counter[str] = Counter()  # hold digest -> decisions that went through
        self.refused: list[str] = []
        self.lock = threading.Lock()
        self.seen: set[str] = set()

    def _one(self, run_id: str, digest: str, barrier: threading.Barrier) -> None:
        barrier.wait()
        try:
            if run_id in self.stopped:
                self.client.deny(run_id, by="chaos", reason="stopped by the drill")
            else:
                self.client.approve(run_id, by="chaos", digest=digest)
        except (DecisionRefusedError, RunNotFoundError) as exc:
            with self.lock:
                self.refused.append(str(exc))
            return
        with self.lock:
            self.done[digest] += 1

    def tick(self) -> None:
        """Decide each hold not decided before, twice at once."""
        for run_id, tenant in self.runs.items():
            state = self.client.state(run_id, tenant)
            held = state.held_budget
            if held is None or held.digest in self.seen:
                continue
            self.seen.add(held.digest)
            barrier = threading.Barrier(2)
            pair = [threading.Thread(target=self._one, args=(run_id, held.digest, barrier))
                    for _ in range(2)]  # fmt: skip
            for thread in pair:
                thread.start()
            for thread in pair:
                thread.join(30)


@pytest.fixture
def workers(redis_url: str, unique: str) -> Iterator[list[WorkerProcess]]:
    started: list[WorkerProcess] = []
    yield started
    stop_all([w for w in started if w.process and w.process.poll() is None], timeout_s=10)


def test_kills_and_duplicate_decisions_around_budget_holds_leave_the_ledger_exact(
    redis_url: str, unique: str, workers: list[WorkerProcess], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TURNSTILE_JOBS", SPEC)
    queue, rng = f"xchaos-{unique}", random.Random(SEED)
    tenants = [f"xca-{unique}", f"xcb-{unique}"]

    def start(env: dict[str, str]) -> WorkerProcess:
        worker = WorkerProcess(redis_url, [queue], name=f"xc{len(workers)}-{unique}", env=env,
                               concurrency=2).start()  # fmt: skip
        workers.append(worker)
        return worker

    for env in (DUPLICATING, JOBS, JOBS):  # one at a time: the machine is shared and small
        start(env).wait_ready()
    client = client_for(redis_url)
    runs = {
        client.submit(tenants[i % 2], "u1", "spender", "say lines", PARAMS, queue=queue):
        tenants[i % 2]
        for i in range(RUNS)
    }  # fmt: skip
    stopped = {r for i, r in enumerate(sorted(runs)) if i % 4 == 0}
    deciders = Deciders(client, runs, stopped)

    def all_ended() -> bool:
        return all(client.store.hash(t, r).get("status") == "stopped" for r, t in runs.items())

    kills, started = 0, time.monotonic()
    next_kill = started + rng.uniform(1.0, 2.0)
    while not all_ended() and time.monotonic() - started < CHAOS_S:
        deciders.tick()
        if time.monotonic() >= next_kill:
            live = [w for w in workers if w.process and w.process.poll() is None]
            victim = rng.choice(live)
            victim.kill()
            kills += 1
            start(DUPLICATING if kills % 3 == 0 else JOBS)
            next_kill = time.monotonic() + rng.uniform(1.0, 2.0)
        time.sleep(0.1)

    def settle() -> bool:
        deciders.tick()
        return all_ended()

    wait_until(settle, timeout_s=90, what=lambda: f"every run ends after {kills} kills")
    problems: list[str] = []
    for run_id, tenant in runs.items():
        problems += _run_problems(client, tenant, run_id)
        stored = client.store.hash(tenant, run_id)
        want = ("budget_exhausted", "tokens") if run_id in stopped else ("completed", "")
        if (stored["outcome"], stored["detail"]) != want:
            problems.append(
                f"{run_id}: ended {stored['outcome']} ({stored['detail']}): {stored.get('reason')}"
            )
        events = [e for _, e in client.store.events(tenant, run_id)]
        decided = Counter(e.get("digest") for e in events if e["type"] == "decision")
        problems += [f"{run_id}: hold {d} decided {n} times" for d, n in decided.items() if n > 1]
    for tenant in tenants:
        problems += _ledger_problems(client, tenant, [r for r, t in runs.items() if t == tenant])
    twice = {d: n for d, n in deciders.done.items() if n != 1}
    if twice:
        problems.append(f"holds not decided exactly once: {twice}")
    holds = len(deciders.seen)
    assert kills >= 5, f"only {kills} kills"
    assert holds >= RUNS, f"only {holds} holds were decided"
    assert len(deciders.refused) >= holds, "every duplicate decision is refused"
    assert problems == [], "\n".join(problems)
    print(f"{RUNS} runs, {kills} kills, {holds} holds, {len(deciders.refused)} duplicates refused")
