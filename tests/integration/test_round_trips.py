"""The store round trips a worker's turns cost, counted on the worker's own connections (the
bench's counting worker, tests/bench/counted_worker.py): a run read live streams every turn
without a round trip of its own to ask whether anyone reads (its load says so), and a run
that ends gives its fair-share slot back in its last commit, not in a round trip after it."""

from __future__ import annotations

import json
import tempfile
import uuid
from pathlib import Path
from urllib.parse import urlparse

import pytest

from tests.integration.workers import WorkerProcess, client_for
from tests.wire.wire import MODELS, wire_server
from turnstile.jobs.outcomes import Outcome
from turnstile.jobs.support.scenarios import GOAL, USER
from turnstile.worker.store import live as live_store

pytestmark = pytest.mark.integration

BUDGET = {"max_tokens": 40_000, "max_tool_calls": 8}


def test_a_watched_run_streams_each_turn_with_no_extra_round_trip(redis_url: str) -> None:
    """A support run read live from before its first turn: every turn is streamed, the
    worker sends no EXISTS (nor any other command of its own to learn whether the run is
    read), and no fair-share release after the run's last commit: one commit a turn, and a
    load for each delivery (one, when eager continuation claims every next turn)."""
    queue, tenant = (f"{p}-{uuid.uuid4().hex[:8]}" for p in ("q", "t"))
    client = client_for(redis_url)
    counts = Path(tempfile.mkdtemp(prefix="turnstile-counts-"))
    with wire_server("openai", "slow_answer", by_turn=True) as wire:
        run_id = client.submit(tenant, USER, "support", GOAL, {"model": MODELS["openai"]},
                               budget=BUDGET, queue=queue)  # fmt: skip
        live_store.watch(client.client, tenant, run_id)
        worker = WorkerProcess(
            redis_url, [queue], name=f"counted-{queue}",
            env={**wire.env, "BENCH_COUNT_PORT": str(urlparse(redis_url).port),
                 "BENCH_COUNT_DIR": str(counts), "BENCH_COUNT_DETAIL": "1",
                 "TURNSTILE_EAGER_TURNS": "8"},
        )  # fmt: skip
        celery = worker.args.index("celery")
        worker.args[celery - 1 : celery + 1] = ["-m", "tests.bench.counted_worker"]
        worker.start()
        try:
            worker.wait_ready()
            client.wait(run_id, 60)
        finally:
            worker.stop()
        streamed = [r["stream"] for r in wire.received()]
    state = client.state(run_id)
    assert state.outcome is Outcome.COMPLETED, state.reason
    turns = state.usage.steps
    assert streamed == [True] * turns  # every turn's model call, the first one's too
    said = {e.data.get("turn") for e in client.events(run_id, live=True, timeout_s=5) if e.live}
    assert said >= set(range(2, turns + 1))  # a reader got them (the first turn says no words)
    counted = [json.loads(p.read_text()) for p in counts.glob("*.json")]
    detail: dict[str, int] = {}
    for each in counted:
        for what, n in each["detail"].items():
            detail[what] = detail.get(what, 0) + n
    assert not [what for what in detail if "exists" in what], detail
    # No release after the last commit (fair.release: ZREM the slot, ZREM the active run, the
    # nudge); a commit that queued its next step rather than claim it announces it, with a nudge.
    assert not [what for what in detail if what.startswith("zrem+")], detail
    commits = sum(n for what, n in detail.items() if what.startswith("evalsha:run_commit"))
    loads = sum(n for what, n in detail.items() if what.startswith("evalsha:run_load"))
    assert commits == turns and 1 <= loads <= turns, detail
