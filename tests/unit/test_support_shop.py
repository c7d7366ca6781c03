"""The support job's shop is its tenant's: the tools give the shop the run's tenant, from the
tool context (the run's, never its input), so two tenants that name one shop have two."""

from __future__ import annotations

from typing import Any

from turnstile.jobs.support.job import support_job
from turnstile.jobs.support.shop import InMemoryShop
from turnstile.jobs.tools import ToolContext

ORDER = "ord_1001"  # 4200 cents, cu_ana's in every new shop


def _ctx(tenant: str, args: dict[str, Any], key: str = "k") -> ToolContext:
    return ToolContext(f"run-{tenant}", tenant, "cu_ana", {"shop": "shared"}, args, key, 30.0)


def test_a_tenant_neither_reads_nor_changes_another_tenants_shop_of_the_same_name() -> None:
    """Tenant A refunds in shop "shared"; tenant B's run naming "shared" reads the order as
    new, its refund lands in its own shop, and A's write is not recorded for B."""
    shop = InMemoryShop()
    tools = support_job(shop).tools
    refund = {"order_id": ORDER, "amount_cents": 3000}
    assert tools["issue_refund"].fn(_ctx("a", refund, key="ka")).result["status"] == "ok"
    seen = tools["get_order"].fn(_ctx("b", {"order_id": ORDER})).result
    assert (seen["status"], seen["refunded_cents"]) == ("ok", 0)
    assert tools["issue_refund"].fn(_ctx("b", refund, key="kb")).result == {
        "status": "ok", "refunded_cents": 3000,
    }  # fmt: skip
    assert shop.effects("a", "shared") == [["refund", ORDER, 3000]]
    assert shop.effects("b", "shared") == [["refund", ORDER, 3000]]
    assert shop.orders("a", "shared")[ORDER].refunded_cents == 3000
    recorded = tools["issue_refund"].recorded
    assert recorded is not None
    assert recorded(_ctx("a", {}, key="ka")) and not recorded(_ctx("b", {}, key="ka"))
