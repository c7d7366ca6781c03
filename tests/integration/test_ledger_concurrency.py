"""Four processes share one tenant: admission never overshoots and every unit is accounted."""

from __future__ import annotations

import multiprocessing
import random
import threading
import time

import pytest

from turnstile.ledger import Ledger

pytestmark = pytest.mark.integration

PROCESSES = 4
RESERVATIONS = 500
HELD_AT_ONCE = 5  # each process keeps several holds open, so holds overlap across processes
CEILINGS = {"cost_microusd": 8_000, "tokens": 40_000}  # hard; reached partway through the run


def run_worker(url: str, tenant: str, seed: int) -> dict[str, int]:
    """Reserve random amounts, settle or release them at random; return the actuals booked."""
    rng = random.Random(seed)
    booked = {"cost_microusd": 0, "tokens": 0, "steps": 0, "admitted": 0, "rejected": 0}
    open_holds: list[tuple[str, dict[str, int]]] = []
    with Ledger.from_url(url, timeout_s=5) as ledger:

        def resolve_one() -> None:
            hold_id, amounts = open_holds.pop(rng.randrange(len(open_holds)))
            if rng.random() < 0.3:
                ledger.release(tenant, hold_id)
                return
            actual = {dim: rng.randint(0, amount) for dim, amount in amounts.items()}
            ledger.settle(tenant, hold_id, actual)
            for dim, amount in actual.items():
                booked[dim] += amount

        for i in range(RESERVATIONS):
            amounts = {
                "cost_microusd": rng.randint(1, 50),
                "tokens": rng.randint(1, 200),
                "steps": 1,
            }
            hold_id = f"p{seed}:{i}"
            result = ledger.reserve(tenant, hold_id, amounts, timeout_s=60)
            if result.admitted:
                booked["admitted"] += 1
                open_holds.append((hold_id, amounts))
            else:
                assert result.status == "rejected", result
                booked["rejected"] += 1
            if len(open_holds) >= HELD_AT_ONCE or (open_holds and rng.random() < 0.5):
                resolve_one()
        while open_holds:
            resolve_one()
    return booked


def test_four_processes_never_overshoot_and_every_unit_adds_up(redis_url: str, unique: str) -> None:
    """4 x 500 random reserves with random settles and releases: committed + reserved stays
    under each hard ceiling throughout, and the final figures are the sum of the actuals."""
    monitor = Ledger.from_url(redis_url)
    for dim, ceiling in CEILINGS.items():
        monitor.set_ceiling(unique, dim, ceiling)
    overshoots: list[str] = []
    samples = 0
    done = threading.Event()

    def watch() -> None:
        nonlocal samples
        while not done.is_set():
            for dim, row in monitor.read(unique).items():
                over = row.ceiling is not None and row.committed + row.reserved > row.ceiling
                if row.hard and over:
                    overshoots.append(f"{dim}: {row}")
            samples += 1

    # Fork the workers before the watcher thread starts: forking a threaded process is unsafe.
    with multiprocessing.get_context("fork").Pool(PROCESSES) as pool:
        watcher = threading.Thread(target=watch)
        watcher.start()
        started = time.monotonic()
        try:
            results = pool.starmap(
                run_worker, [(redis_url, unique, seed) for seed in range(PROCESSES)]
            )
        finally:
            done.set()
            watcher.join()
        elapsed = time.monotonic() - started

    assert overshoots == []
    assert samples > 10
    state = monitor.read(unique)
    for dim in ("cost_microusd", "tokens", "steps"):
        assert state[dim].committed == sum(r[dim] for r in results), dim
        assert state[dim].reserved == 0, dim
    assert sum(r["admitted"] for r in results) > 0
    assert sum(r["rejected"] for r in results) > 0  # the ceilings were reached
    journal_cost = sum(
        ch.committed_delta
        for entry in monitor.journal(unique)
        for ch in entry.changes
        if ch.dimension == "cost_microusd"
    )
    assert journal_cost == state["cost_microusd"].committed
    assert elapsed < 30
    monitor.close()
