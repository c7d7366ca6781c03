"""The support job's four tools over a shop store, with simulated latencies.

Latencies are reported, not slept: on a simulated clock the runs are instant and exact, and a
scenario can make one tool slow through the run's params (`tool_latency_s`).
"""

from __future__ import annotations

import dataclasses
import os
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from turnstile.jobs.support.shop import ShopBackend, order_view, refund, status_email
from turnstile.jobs.tools import Tool, ToolContext, ToolOutput

DEFAULT_LATENCY_S = {
    "get_order": 0.4,
    "search_policy": 0.8,
    "issue_refund": 1.2,
    "send_status_email": 0.9,
}
REPLAY_LATENCY_S = 0.1  # a write answered from its idempotency record is quick
TOOL_TIMEOUT_S = 30.0  # each call also gets no more than the run's remaining time
POLICY_SENTENCE = "Items may be returned within 30 days of arrival. "
POLICY_TEXT = POLICY_SENTENCE * 90  # a deliberately large result, about 1,100 tokens

REFUND_DIMENSION = "refund_cents"  # the job's own ledger dimension: money refunded
_ORDER_ID = {"type": "string", "minLength": 1, "maxLength": 64}


def _object(properties: Mapping[str, Any], required: list[str]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": dict(properties),
        "required": required,
        "additionalProperties": False,
    }


def latency_s(ctx: ToolContext, name: str) -> float:
    overrides = ctx.params.get("tool_latency_s") or {}
    return float(overrides.get(name, DEFAULT_LATENCY_S[name]))


def shop_of(ctx: ToolContext) -> str:
    """The name of the run's shop: runs share a shop only when they say so (`params.shop`); by
    default each run has its own. A shop is the run's tenant's (`ctx.tenant`, from the run):
    runs of two tenants that give one name have two shops."""
    return str(ctx.params.get("shop") or ctx.run_id)


# Failure drills a run can ask for in its params: `die_in` names a tool whose call kills its
# own process, as a crashing dependency would; `sleep_s` makes a tool really slow (after its
# effect, for a write), so that a worker can be stopped in the middle of a turn. They act only
# in a job built with drills on (a test or staging system); otherwise they are ignored.
DRILL_PARAMS = ("die_in", "sleep_s", "model_sleep_s")


@dataclass(frozen=True)
class Drills:
    on: bool

    def die(self, ctx: ToolContext, name: str) -> None:
        if self.on and ctx.params.get("die_in") == name:
            os.kill(os.getpid(), signal.SIGKILL)

    def pause(self, ctx: ToolContext, name: str) -> None:
        seconds = float((ctx.params.get("sleep_s") or {}).get(name, 0)) if self.on else 0.0
        if seconds:
            time.sleep(seconds)


def support_tools(shop: ShopBackend, *, drills: bool = False) -> dict[str, Tool]:
    drill = Drills(drills)

    def get_order(ctx: ToolContext) -> ToolOutput:
        drill.die(ctx, "get_order")
        drill.pause(ctx, "get_order")
        order = shop.get_order(ctx.tenant, shop_of(ctx), str(ctx.args["order_id"]))
        return ToolOutput(order_view(order, ctx.user_id), latency_s(ctx, "get_order"))

    def search_policy(ctx: ToolContext) -> ToolOutput:
        drill.die(ctx, "search_policy")
        drill.pause(ctx, "search_policy")
        return ToolOutput({"status": "ok", "text": POLICY_TEXT}, latency_s(ctx, "search_policy"))

    def write(ctx: ToolContext, name: str, amount_cents: int | None) -> ToolOutput:
        order_id = str(ctx.args["order_id"])

        def rule(order: Any) -> Any:
            if amount_cents is None:
                return status_email(order, user_id=ctx.user_id, order_id=order_id)
            return refund(
                order,
                user_id=ctx.user_id,
                order_id=order_id,
                amount_cents=amount_cents,
                approved=ctx.approved,
            )

        drill.die(ctx, name)
        result, replayed = shop.write_once(
            ctx.tenant, shop_of(ctx), key=ctx.key, name=name, order_id=order_id, rule=rule
        )
        drill.pause(ctx, name)
        if replayed:
            return ToolOutput({**result, "replayed": True}, REPLAY_LATENCY_S)
        return ToolOutput(result, latency_s(ctx, name))

    def issue_refund(ctx: ToolContext) -> ToolOutput:
        amount_cents = int(ctx.args["amount_cents"])
        out = write(ctx, "issue_refund", amount_cents)
        refunded = amount_cents if out.result.get("status") == "ok" else 0
        return dataclasses.replace(out, charges={REFUND_DIMENSION: refunded})

    def send_status_email(ctx: ToolContext) -> ToolOutput:
        return write(ctx, "send_status_email", None)

    def recorded(name: str) -> Callable[[ToolContext], bool]:
        def done(ctx: ToolContext) -> bool:
            return shop.done(ctx.tenant, shop_of(ctx), ctx.key, name)

        return done

    tools = [
        Tool(
            name="get_order",
            description=(
                "Look up an order of the current customer: its status, its total and what was"
                " already refunded, in cents."
            ),
            fn=get_order,
            schema=_object({"order_id": _ORDER_ID}, ["order_id"]),
            facts=("order_status", "total_cents", "refunded_cents"),
            fact_scope="order_id",
            timeout_s=TOOL_TIMEOUT_S,
            done_text="we looked up your order",
            open_text="we did not get to look up your order",
        ),
        Tool(
            name="search_policy",
            description="Search the shop's returns and refunds policy text.",
            fn=search_policy,
            schema=_object(
                {"q": {"type": "string", "maxLength": 500}, "order_id": _ORDER_ID}, ["q"]
            ),
            cost_bound_microusd=200,  # a paid search service
            timeout_s=TOOL_TIMEOUT_S,
        ),
        Tool(
            name="issue_refund",
            description=(
                "Refund part or all of an order to the customer, in cents, with a short"
                " reason. Cannot be undone."
            ),
            fn=issue_refund,
            schema=_object(
                {
                    "order_id": _ORDER_ID,
                    "amount_cents": {"type": "integer", "minimum": 1, "maximum": 10_000_000},
                    "reason": {"type": "string", "maxLength": 200},
                },
                ["order_id", "amount_cents"],
            ),
            mutates=True,
            reversible=False,
            charges={REFUND_DIMENSION: "amount_cents"},
            facts=("refunded_cents",),
            fact_scope="order_id",
            timeout_s=TOOL_TIMEOUT_S,
            done_text="the refund was issued",
            open_text="the refund was not issued",
            recorded=recorded("issue_refund"),
        ),
        Tool(
            name="send_status_email",
            description=(
                "Email the customer the current status of their order, refund included."
                " Cannot be undone."
            ),
            fn=send_status_email,
            schema=_object({"order_id": _ORDER_ID}, ["order_id"]),
            mutates=True,
            reversible=False,
            cost_bound_microusd=50,
            facts=("sent",),
            fact_scope="order_id",
            timeout_s=TOOL_TIMEOUT_S,
            done_text="the confirmation email was sent",
            open_text="the confirmation email was not sent",
            recorded=recorded("send_status_email"),
        ),
    ]
    return {t.name: t for t in tools}
