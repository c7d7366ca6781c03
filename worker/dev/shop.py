"""The demo shop in Redis: the same rules as `jobs.support.shop.InMemoryShop`, shared by every
worker process.

The business rule stays in Python (a pure function of the order); Redis only makes its outcome
atomic. A write reads the order and any stored result in one script, applies the rule here, then
compare-and-sets in a second script: stored only if (key, name) is still unstored and the order
is unchanged, otherwise it reads again. So a write costs two round trips when uncontended, a
replay or a refusal one.
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import msgspec
import redis

from turnstile.errors import TurnstileError
from turnstile.jobs.support.shop import Applied, Order, demo_orders
from turnstile.worker.store import keys
from turnstile.worker.store.scripts import register
from turnstile.worker.store.values import text


class ShopKeys(NamedTuple):
    """Every key of one tenant's shop, in the order the scripts take them as KEYS. All share
    the tenant's hash tag (`keys.shop`), so each script touches one cluster slot."""

    orders: str  # hash: order id -> order JSON
    done: str  # hash: "<key>|<name>" -> done record JSON ({"call", "result"})
    effects: str  # list: effect JSON, oldest first


def shop_keys(tenant: str, shop: str) -> ShopKeys:
    return ShopKeys(*(keys.shop(tenant, shop, part) for part in ShopKeys._fields))


MAX_WRITE_ATTEMPTS = 20
"""Reads and compare-and-sets before a write gives up. A failed compare means another write to
the same order succeeded meanwhile, so the shop as a whole always progresses; twenty losses in a
row take a hot order indeed."""

CONTENTION_PAUSE_S = 0.001
"""Upper bound of the random pause after the n-th lost compare is n times this: it spreads out
writers that keep colliding, at a cost of milliseconds."""


class ShopError(TurnstileError):
    """A shop call that cannot be carried out (not a refusal: those are results)."""


class ShopContention(ShopError):  # noqa: N818 - named for what happened, like StoreUnavailable
    """The order kept changing under a write; nothing was written by this call."""


class _Done(msgspec.Struct):
    """What the done hash holds per (key, name): the result, and which call stored it, so that
    a call whose own write is answered as a replay (a client retry after a lost reply) still
    reports it as its own."""

    call: str
    result: dict[str, Any]


_SEED = [
    part
    for order_id, order in demo_orders().items()
    for part in (order_id, msgspec.json.encode(order).decode())
]


def _pairs(flat: Sequence[bytes | str]) -> dict[str, bytes | str]:
    return {text(flat[i]): flat[i + 1] for i in range(0, len(flat), 2)}


def _order(raw: bytes | str | None) -> Order | None:
    return None if raw is None else msgspec.json.decode(raw, type=Order)


def _done_field(key: str, name: str) -> str:
    if "|" in name:
        raise ShopError(f"a write's name may not contain '|': {name!r}")
    return f"{key}|{name}"


class RedisShop:
    """A `ShopBackend` over one Redis client. Shops are created on first touch, with the demo
    orders, and kept until their keys are deleted. Each is one tenant's (see `shop_keys`)."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self._read = register(client, "shop_read")
        self._write = register(client, "shop_write")

    def _snapshot(
        self, one: ShopKeys, *, done_field: str, order_id: str, every: bool = False
    ) -> tuple[_Done | None, dict[str, bytes | str]]:
        """One round trip: seed if new, then the done record (if asked and stored) and the
        order (or every order)."""
        done, flat = self._read(
            keys=[one.orders, one.done],
            args=[done_field, "1" if every else "0", order_id, *_SEED],
        )
        stored = None if done is None else msgspec.json.decode(done, type=_Done)
        return stored, _pairs(flat)

    def get_order(self, tenant: str, shop: str, order_id: str) -> Order | None:
        _, found = self._snapshot(shop_keys(tenant, shop), done_field="", order_id=order_id)
        return _order(found.get(order_id))

    def orders(self, tenant: str, shop: str) -> dict[str, Order]:
        one = shop_keys(tenant, shop)
        _, found = self._snapshot(one, done_field="", order_id="", every=True)
        return {order_id: msgspec.json.decode(raw, type=Order) for order_id, raw in found.items()}

    def effects(self, tenant: str, shop: str) -> list[list[Any]]:
        raw = self.client.lrange(shop_keys(tenant, shop).effects, 0, -1)
        return [msgspec.json.decode(item, type=list[Any]) for item in raw]

    def done(self, tenant: str, shop: str, key: str, name: str) -> bool:
        return bool(self.client.hexists(shop_keys(tenant, shop).done, _done_field(key, name)))

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
        """Apply `rule` to the order atomically, once per (key, name); see `ShopBackend`."""
        field = _done_field(key, name)
        call = uuid.uuid4().hex
        one = shop_keys(tenant, shop)
        for attempt in range(1, MAX_WRITE_ATTEMPTS + 1):
            stored, found = self._snapshot(one, done_field=field, order_id=order_id)
            if stored is not None:
                return stored.result, stored.call != call
            seen = found.get(order_id)
            applied = rule(_order(seen))
            if applied.result.get("status") != "ok":
                return dict(applied.result), False  # a refusal stores nothing
            reply = self._compare_and_set(
                one, field=field, order_id=order_id, seen=seen, call=call, applied=applied
            )
            if reply is not None:
                return reply
            time.sleep(random.uniform(0, CONTENTION_PAUSE_S * attempt))
        raise ShopContention(
            f"write {name!r} under key {key!r} to order {order_id!r} of shop {shop!r} of "
            f"tenant {tenant!r} gave up "
            f"after {MAX_WRITE_ATTEMPTS} attempts: the order kept changing under it"
        )

    def _compare_and_set(
        self,
        one: ShopKeys,
        *,
        field: str,
        order_id: str,
        seen: bytes | str | None,
        call: str,
        applied: Applied,
    ) -> tuple[dict[str, Any], bool] | None:
        """The second round trip. None when the order changed since it was read."""
        reply = self._write(
            keys=list(one),
            args=[
                field,
                order_id,
                b"" if seen is None else seen,
                msgspec.json.encode(_Done(call=call, result=applied.result)),
                b"" if applied.order is None else msgspec.json.encode(applied.order),
                b"" if applied.effect is None else msgspec.json.encode(applied.effect),
            ],
        )
        match text(reply[0]):
            case "stored":
                return dict(applied.result), False
            case "replay":
                done = msgspec.json.decode(reply[1], type=_Done)
                return done.result, done.call != call
            case "changed":
                return None
            case other:
                raise ShopError(f"shop_write replied {other!r}")
