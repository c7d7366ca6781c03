"""A job's own ledger dimension capped per tenant across worker processes."""

from __future__ import annotations

import pytest

from tests.integration.workers import client_for, running_workers, settled, wait_until
from turnstile.jobs.support.scenarios import GOAL, USER
from turnstile.worker.dev.shop import RedisShop
from turnstile.worker.ops.replay import replay_run

pytestmark = pytest.mark.integration


def test_refunds_never_pass_the_tenants_refund_ceiling_across_workers(
    redis_url: str, unique: str
) -> None:
    """40 refund runs of one tenant on two worker processes against a refund_cents ceiling
    that admits half: the refunded total (in the shops and in the ledger) never passes it,
    and every other run ends budget_exhausted naming tenant.refund_cents. Replay reproduces
    every one of them, the refused ones included."""
    tenant, queue = f"refunds-{unique}", f"refunds-{unique}"
    amount_cents, ceiling = 3000, 20 * 3000
    with running_workers(redis_url, [queue], 2):
        client = client_for(redis_url)
        client.ledger.set_ceiling(tenant, "refund_cents", ceiling, period="day")
        params = {"model_latency_s": 0, "amount_cents": amount_cents}
        runs = [
            client.submit(tenant, USER, "support", GOAL, params, queue=queue) for _ in range(40)
        ]
        peak = 0

        def done() -> bool:
            nonlocal peak
            figures = client.ledger.read(tenant)["refund_cents"]
            peak = max(peak, figures.committed + figures.reserved)
            return settled(client, runs)

        wait_until(done, timeout_s=180, every_s=0.02, what="40 refund runs end")
    figures = client.ledger.read(tenant)["refund_cents"]
    states = [client.state(r) for r in runs]
    shop = RedisShop(client.client)
    refunded = sum(e[2] for r in runs for e in shop.effects(tenant, r) if e[0] == "refund")
    assert peak <= ceiling and figures.reserved == 0
    assert refunded == figures.committed <= ceiling
    assert figures.committed == sum(s.usage.extra.get("refund_cents", 0) for s in states)
    outcomes = [(s.outcome and s.outcome.value, s.detail) for s in states]
    assert set(outcomes) == {("completed", None), ("budget_exhausted", "tenant.refund_cents")}
    assert outcomes.count(("completed", None)) == 20  # each admitted hold is exactly one refund
    replays = [replay_run(client, r) for r in runs]
    assert [(r.matches, r.notes) for r in replays] == [(True, [])] * 40
