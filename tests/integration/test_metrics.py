"""The worker's Prometheus endpoint, scraped from a real worker: the main process serves what
its pool processes recorded, with the labels the dashboards query."""

from __future__ import annotations

import socket
import time
import urllib.request
import uuid
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.workers import (
    WorkerProcess,
    client_for,
    running_workers,
    settled,
    wait_until,
)
from turnstile.jobs.budget import Budget
from turnstile.worker.client._client import Client
from turnstile.worker.dev.embedded import EmbeddedServer
from turnstile.worker.scheduling import fair

pytestmark = pytest.mark.integration

USER, GOAL = "cu_ana", "refund the damaged item on order ord_1001"

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def moved(before: Samples, after: Samples, name: str, **labels: str) -> float:
    return value(after, name, **labels) - value(before, name, **labels)


@pytest.fixture(scope="module")
def queue() -> str:
    return f"m-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def port() -> int:
    return free_port()


@pytest.fixture(scope="module")
def pool(redis_url: str, queue: str, port: int) -> Iterator[list[WorkerProcess]]:
    with running_workers(redis_url, [queue], 1, env={"TURNSTILE_METRICS_PORT": str(port)}) as ws:
        wait_until(lambda: bool(ws[0].events("metrics_serving")), what="the metrics endpoint")
        yield ws


@pytest.fixture
def client(redis_url: str, pool: list[WorkerProcess]) -> Client:
    return client_for(redis_url)


def test_steps_outcomes_and_refusals_are_counted_with_their_labels(
    client: Client, queue: str, port: int, unique: str
) -> None:
    """Two support runs that complete and one whose tenant has no room: the step results,
    their durations, the outcomes and the refused dimension all move by what happened."""
    before = scrape(port)
    tenant, capped = f"t-{unique}", f"cap-{unique}"
    runs = [client.submit(tenant, USER, "support", GOAL, {}, queue=queue) for _ in range(2)]
    # The capped tenant's ceiling is held in full by someone else, so its first turn is refused.
    client.ledger.set_ceiling(capped, "cost_microusd", 100_000)
    assert client.ledger.reserve(capped, "hog", {"cost_microusd": 100_000}, timeout_s=600).admitted
    refused = client.submit(
        capped, USER, "support", GOAL, {}, budget=Budget(max_cost_microusd=50_000), queue=queue
    )
    wait_until(lambda: settled(client, [*runs, refused]), timeout_s=90, what="the runs end")
    assert {client.state(r).outcome for r in runs} == {"completed"}
    assert (client.state(refused).outcome, client.state(refused).detail) == (
        "budget_exhausted",
        "tenant.cost_microusd",
    )

    def counted() -> bool:  # the counters move just after the commit the runs show
        after = scrape(port)
        return moved(before, after, "turnstile_steps_total", result="finished") >= 2 and (
            moved(before, after, "turnstile_steps_total", result="refused") >= 1
        )

    wait_until(counted, timeout_s=10, what="the counters move")
    after = scrape(port)
    turns = sum(client.state(r).usage.steps for r in runs)
    assert moved(before, after, "turnstile_steps_total", result="finished") == 2
    assert moved(before, after, "turnstile_steps_total", result="refused") == 1
    assert moved(before, after, "turnstile_steps_total", result="continued") == turns - 2
    assert moved(before, after, "turnstile_step_seconds_count", result="finished") == 2
    assert moved(before, after, "turnstile_step_seconds_sum", result="continued") > 0
    assert moved(before, after, "turnstile_step_seconds_bucket", result="finished", le="+Inf") == 2
    assert (
        moved(before, after, "turnstile_runs_finished_total", outcome="completed", detail="") == 2
    )
    assert (
        moved(
            before,
            after,
            "turnstile_runs_finished_total",
            outcome="budget_exhausted",
            detail="tenant.cost_microusd",
        )
        == 1
    )
    assert moved(before, after, "turnstile_ledger_refusals_total", dimension="cost_microusd") == 1
    assert value(after, "turnstile_steps_in_progress") == 0
    # Every turn after a run's first started some time after the commit before it: claimed by
    # that commit (eager) or through the queue.
    gaps = sum(
        moved(before, after, "turnstile_turn_gap_seconds_count", path=path)
        for path in ("eager", "queued")
    )
    assert gaps == turns - 2


@pytest.mark.slow  # over 14 s on 2 cores: CI runs it in the slow part
def test_a_killed_pool_process_is_counted_and_leaves_nothing_in_progress(
    client: Client, queue: str, port: int, unique: str
) -> None:
    """A turn that kills its pool process every time: the run ends `error` (poison), counted as
    such, and the in-progress gauge of each killed process is dropped at the next scrape."""
    before = scrape(port)
    poison = client.submit(
        f"t-{unique}", USER, "support", GOAL, {"die_in": "get_order"}, queue=queue
    )
    wait_until(lambda: settled(client, [poison]), timeout_s=90, what="the poisoned run ends")
    assert client.state(poison).outcome == "error"
    wait_until(
        lambda: moved(before, scrape(port), "turnstile_steps_total", result="poison") == 1,
        timeout_s=10,
        what="the poison step is counted",
    )
    after = scrape(port)
    assert moved(before, after, "turnstile_runs_finished_total", outcome="error", detail="") == 1
    assert value(after, "turnstile_steps_in_progress") == 0


@pytest.mark.slow  # over 10 s on 2 cores: CI runs it in the slow part
def test_retries_are_counted_by_reason(unique: str) -> None:
    """With the store down, steps are put back with backoff and counted as retries of
    `store_unavailable`; when it is back the runs finish."""
    port = free_port()
    with EmbeddedServer() as broker, EmbeddedServer(appendonly=True) as store:
        queue = f"mdown-{unique}"
        env = {"TURNSTILE_METRICS_PORT": str(port)}
        with running_workers(store.url, [queue], 1, broker_url=broker.url, env=env) as workers:
            wait_until(lambda: bool(workers[0].events("metrics_serving")), what="the endpoint")
            client = client_for(store.url, broker_url=broker.url)
            runs = [
                client.submit(
                    "t", USER, "support", GOAL, {"sleep_s": {"get_order": 0.5}}, queue=queue
                )
                for _ in range(2)
            ]
            time.sleep(0.3)
            store.stop()
            wait_until(
                lambda: (
                    value(scrape(port), "turnstile_step_retries_total", reason="store_unavailable")
                    > 0
                ),
                timeout_s=20,
                what="a retry is counted",
            )
            store.start()
            client = client_for(store.url, broker_url=broker.url)
            wait_until(lambda: settled(client, runs), timeout_s=90, what="runs finish after")
            after = scrape(port)
            assert value(after, "turnstile_steps_total", result="retry") >= value(
                after, "turnstile_step_retries_total", reason="store_unavailable"
            )
            assert {client.state(r).outcome for r in runs} == {"completed"}


def test_each_tenants_waiting_steps_turns_in_flight_and_cap_are_gauged(
    client: Client, port: int, queue: str
) -> None:
    """The dispatcher publishes, per tenant with work, its steps waiting, its turns in flight
    and its cap (turnstile_tenant_*), set by `turnstile tenants set`."""
    tenant = f"g-{uuid.uuid4().hex[:8]}"
    fair.set_caps(client.client, tenant, {"turns_in_flight": 3})
    slow = {"sleep_s": {"get_order": 0.5}}
    run_ids = [client.submit(tenant, USER, "support", GOAL, slow, queue=queue)
               for _ in range(4)]  # fmt: skip

    def gauged() -> bool:
        samples = scrape(port)
        return (
            value(samples, "turnstile_tenant_turns_cap", tenant=tenant) == 3
            and (
                value(samples, "turnstile_tenant_waiting_steps", tenant=tenant)
                + value(samples, "turnstile_tenant_turns_in_flight", tenant=tenant)
            )
            > 0
        )

    wait_until(gauged, timeout_s=30, every_s=0.1, what="the tenant's gauges")
    wait_until(lambda: settled(client, run_ids), timeout_s=60, what="the runs end")
