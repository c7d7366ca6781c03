"""Two workers race for the last $28 of a $100 allowance; only one gets $20."""

from __future__ import annotations

import threading

import pytest

from turnstile.ledger import Ledger, Rejection, ReserveResult

pytestmark = pytest.mark.integration

DOLLAR = 1_000_000  # micro-dollars


def test_two_workers_reserving_at_once_only_one_is_admitted(redis_url: str, unique: str) -> None:
    """At $72 of $100, two simultaneous $20 reserves admit exactly one; it settles at $14 and
    the other $6 goes back to the tenant."""
    setup = Ledger.from_url(redis_url)
    setup.set_ceiling(unique, "cost_microusd", 100 * DOLLAR, period="day")
    setup.reserve(unique, "earlier", {"cost_microusd": 72 * DOLLAR}, timeout_s=60)
    setup.settle(unique, "earlier", {"cost_microusd": 72 * DOLLAR})

    workers = [Ledger.from_url(redis_url) for _ in range(2)]
    for worker in workers:  # connect first, so the barrier lines up the two scripts
        worker.client.ping()
    barrier = threading.Barrier(2)
    results: dict[str, ReserveResult] = {}

    def step(name: str, worker: Ledger) -> None:
        barrier.wait()
        results[name] = worker.reserve(
            unique, f"{name}:step-11", {"cost_microusd": 20 * DOLLAR}, timeout_s=120
        )

    threads = [
        threading.Thread(target=step, args=(f"worker-{i}", w)) for i, w in enumerate(workers)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    admitted = [name for name, result in results.items() if result.admitted]
    rejected = [result for result in results.values() if not result.admitted]
    assert len(admitted) == 1 and len(rejected) == 1
    assert rejected[0].status == "rejected"
    assert rejected[0].rejected == (
        Rejection(dimension="cost_microusd", requested=20 * DOLLAR, available=8 * DOLLAR),
    )
    during = setup.read(unique)["cost_microusd"]
    assert (during.committed, during.reserved) == (72 * DOLLAR, 20 * DOLLAR)

    setup.settle(unique, f"{admitted[0]}:step-11", {"cost_microusd": 14 * DOLLAR})
    after = setup.read(unique)["cost_microusd"]
    assert (after.committed, after.reserved) == (86 * DOLLAR, 0)
    assert after.ceiling is not None
    assert after.ceiling - after.committed - after.reserved == 14 * DOLLAR  # $8 + the $6 back
    for ledger in [setup, *workers]:
        ledger.close()
