"""The demo shop's rules, and a store for them kept in memory.

The rules are pure functions of an order; a store only has to apply them atomically and
remember each write under its idempotency key, so the same logical write twice is one write.
The Redis store in the worker applies the same rules.

A shop belongs to a tenant: every call names the tenant (the run's, from its tool context,
never from the run's input) and the shop's name, so two tenants' shops of one name are two
shops, and no tenant reads or writes another's.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import msgspec

AUTO_REFUND_LIMIT_CENTS = 5000  # above this a refund needs a person's approval


class Order(msgspec.Struct, kw_only=True):
    customer: str
    total_cents: int
    refunded_cents: int = 0
    status: str = "delivered"


def demo_orders() -> dict[str, Order]:
    """Every shop starts with these two orders of customer cu_ana (the reference scenarios'
    fixtures)."""
    return {
        "ord_1001": Order(customer="cu_ana", total_cents=4200),
        "ord_1004": Order(customer="cu_ana", total_cents=15000),
    }


@dataclass(frozen=True)
class Applied:
    result: dict[str, Any]
    order: Order | None = None  # the order as it is after the write, when it changed
    effect: list[Any] | None = None  # what happened in the world, for the effects log


def _not_found() -> Applied:
    return Applied({"status": "error", "code": "not_found"})


def owned(order: Order | None, user_id: str) -> bool:
    return order is not None and order.customer == user_id


def order_view(order: Order | None, user_id: str) -> dict[str, Any]:
    if order is None or not owned(order, user_id):
        return _not_found().result
    return {
        "status": "ok",
        "order_status": order.status,
        "total_cents": order.total_cents,
        "refunded_cents": order.refunded_cents,
    }


def refund(
    order: Order | None, *, user_id: str, order_id: str, amount_cents: int, approved: bool
) -> Applied:
    if order is None or not owned(order, user_id):
        return _not_found()
    if amount_cents > order.total_cents - order.refunded_cents:
        return Applied(
            {"status": "error", "code": "invalid_state", "detail": "amount exceeds refundable"}
        )
    if amount_cents > AUTO_REFUND_LIMIT_CENTS and not approved:
        return Applied({"status": "needs_approval"})
    after = msgspec.structs.replace(order, refunded_cents=order.refunded_cents + amount_cents)
    return Applied(
        {"status": "ok", "refunded_cents": after.refunded_cents},
        order=after,
        effect=["refund", order_id, amount_cents],
    )


def status_email(order: Order | None, *, user_id: str, order_id: str) -> Applied:
    if order is None or not owned(order, user_id):
        return _not_found()
    return Applied({"status": "ok", "sent": True}, effect=["email", order_id])


class ShopBackend(Protocol):
    def get_order(self, tenant: str, shop: str, order_id: str) -> Order | None: ...

    def write_once(
        self,
        tenant: str,
        shop: str,
        *,
        key: str,
        name: str,
        order_id: str,
        rule: Callable[[Order | None], Applied],
    ) -> tuple[dict[str, Any], bool]:
        """Apply `rule` to the order atomically, once per (key, name): a repeat returns the
        stored result and True. Only a successful write is stored, so a refused one may be
        tried again (after an approval, say) under the same key."""
        ...

    def effects(self, tenant: str, shop: str) -> list[list[Any]]: ...

    def done(self, tenant: str, shop: str, key: str, name: str) -> bool:
        """Whether the write (key, name) is stored: read-only, nothing is applied."""
        ...


Shop = tuple[str, str]  # (tenant, name): one shop


class InMemoryShop:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._orders: dict[Shop, dict[str, Order]] = {}
        self._done: dict[tuple[Shop, str, str], dict[str, Any]] = {}
        self._effects: dict[Shop, list[list[Any]]] = {}

    def _shop(self, shop: Shop) -> dict[str, Order]:
        return self._orders.setdefault(shop, demo_orders())

    def get_order(self, tenant: str, shop: str, order_id: str) -> Order | None:
        with self._lock:
            return copy.copy(self._shop((tenant, shop)).get(order_id))

    def write_once(
        self,
        tenant: str,
        shop: str,
        *,
        key: str,
        name: str,
        order_id: str,
        rule: Callable[[Order | None], Applied],
    ) -> tuple[dict[str, Any], bool]:
        one = (tenant, shop)
        with self._lock:
            stored = self._done.get((one, key, name))
            if stored is not None:
                return dict(stored), True
            orders = self._shop(one)
            applied = rule(copy.copy(orders.get(order_id)))
            if applied.result.get("status") == "ok":
                if applied.order is not None:
                    orders[order_id] = applied.order
                if applied.effect is not None:
                    self._effects.setdefault(one, []).append(applied.effect)
                self._done[(one, key, name)] = dict(applied.result)
            return dict(applied.result), False

    def effects(self, tenant: str, shop: str) -> list[list[Any]]:
        with self._lock:
            return [list(e) for e in self._effects.get((tenant, shop), [])]

    def done(self, tenant: str, shop: str, key: str, name: str) -> bool:
        with self._lock:
            return ((tenant, shop), key, name) in self._done

    def orders(self, tenant: str, shop: str) -> dict[str, Order]:
        with self._lock:
            return {k: copy.copy(v) for k, v in self._shop((tenant, shop)).items()}
