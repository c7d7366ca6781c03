"""The run store's commit against a real server: a turn's settlements are all or nothing."""

from __future__ import annotations

import pytest

from jobs.support.scenarios import GOAL, USER
from tests.integration.workers import client_for
from worker.store import Change

pytestmark = pytest.mark.integration


def test_a_refused_settlement_leaves_the_other_settlements_and_the_run_unwritten(
    redis_url: str, unique: str
) -> None:
    """A commit settling two holds, the second of which the ledger refuses (settled before
    with another actual), writes nothing: the first hold is still held and the run keeps its
    version."""
    client = client_for(redis_url)
    tenant = f"t-{unique}"
    run_id = client.submit(tenant, USER, "support", GOAL, {}, queue=f"nobody-{unique}")
    client.client.delete(f"nobody-{unique}")  # no worker reads it; the step is not needed
    ledger = client.ledger
    assert ledger.reserve(tenant, "h1", {"cost_microusd": 500}, timeout_s=60).admitted
    assert ledger.reserve(tenant, "h2", {"cost_microusd": 700}, timeout_s=60).admitted
    assert not ledger.settle(tenant, "h2", {"cost_microusd": 100}).replayed
    before = ledger.read(tenant)["cost_microusd"]
    settlements = [
        ledger.settle_script_args(tenant, "h1", {"cost_microusd": 300})[1],
        ledger.settle_script_args(tenant, "h2", {"cost_microusd": 200})[1],
    ]
    change = Change(
        tenant=tenant,
        run_id=run_id,
        version=1,
        old_status="running",
        status="running",
        settlements=settlements,
    )
    committed = client.store.commit(change)
    assert committed.kind == "ledger"
    after = ledger.read(tenant)["cost_microusd"]
    assert (after.committed, after.reserved) == (before.committed, before.reserved) == (100, 500)
    assert client.run_hash(run_id)[1]["version"] == "1"
