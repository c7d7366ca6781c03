"""The demo shop in Redis: the same rules as `jobs.support.shop.InMemoryShop`, shared by every
worker process.

The business rule stays in Python (a pure function of the order); Redis only makes its outcome
atomic. A write reads the order and any stored result in one script, applies the rule here, then
compare-and-sets in a second script: stored only if (key, name) is still unstored and the order
is unchanged, otherwise the script answers with the order as it is now and the rule runs again
on it. So a write costs two round trips when uncontended, a replay or a refusal one.

A shop remembers the last bytes it read or wrote of each order (`ORDERS_REMEMBERED` of them):
a write to an order it remembers applies the rule to those bytes and goes straight to the
compare-and-set, one round trip, since the compare holds the write to exactly those bytes
anyway. (A support run reads its order, then refunds, then emails: two round trips of its five
fewer; under `appendfsync always` each is a wait for an fsync.) A remembered order that changed
meanwhile fails the compare, whose reply carries the order as it is, as above; a refusal is
only ever answered from the order as the server just gave it, never from remembered bytes.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import msgspec
import redis

from turnstile.errors import TurnstileError
from turnstile.jobs.support.shop import Applied, Order, demo_orders
from turnstile.worker.store import keys, scripts
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


ORDERS_REMEMBERED = 4096
"""Orders a shop object remembers (the last bytes it read or wrote of each), least recently
used first out: a support run's shop is its own, and a worker process has at most a few hundred
runs in flight, so this covers them at about 100 bytes each."""


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


class _Changed(NamedTuple):
    """A compare-and-set that found the order changed: the order as it found it, or None
    when there was none."""

    now: bytes | str | None


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
        self._read = scripts.register(client, "shop_read")
        self._write = scripts.register(client, "shop_write")
        # (orders key, order id) -> the order's bytes as last read or written here; a write
        # that finds its order here tries its compare-and-set without reading first.
        self._seen: OrderedDict[tuple[str, str], bytes | str] = OrderedDict()
        self._seen_lock = threading.Lock()  # a threads pool shares one shop

    def _remember(self, orders: str, order_id: str, raw: bytes | str | None) -> None:
        """Remember `raw` as the order's bytes now (None: forget them)."""
        where = (orders, order_id)
        with self._seen_lock:
            self._seen.pop(where, None)
            if raw is None:
                return
            self._seen[where] = raw
            if len(self._seen) > ORDERS_REMEMBERED:
                self._seen.popitem(last=False)

    def _snapshot(
        self, one: ShopKeys, *, done_field: str, order_id: str, every: bool = False
    ) -> tuple[_Done | None, dict[str, bytes | str]]:
        """One round trip: seed if new, then the done record (if asked and stored) and the
        order (or every order)."""
        done, flat = scripts.call_script(
            self.client, self._read, [one.orders, one.done],
            [done_field, "1" if every else "0", order_id, *_SEED],
        )  # fmt: skip
        stored = None if done is None else msgspec.json.decode(done, type=_Done)
        found = _pairs(flat)
        for seen_id, raw in found.items():
            self._remember(one.orders, seen_id, raw)
        if not every and order_id and stored is None and order_id not in found:
            self._remember(one.orders, order_id, None)
        return stored, found

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
        with self._seen_lock:
            seen = self._seen.get((one.orders, order_id))
        fresh = False  # whether `seen` is the order as this call was told it is now
        attempt = 0  # the fresh orders the rule was applied to
        while True:
            if seen is None and not fresh:
                stored, found = self._snapshot(one, done_field=field, order_id=order_id)
                if stored is not None:
                    return stored.result, stored.call != call
                seen, fresh = found.get(order_id), True
            if fresh:
                attempt += 1
                if attempt > MAX_WRITE_ATTEMPTS:
                    raise ShopContention(
                        f"write {name!r} under key {key!r} to order {order_id!r} of shop "
                        f"{shop!r} of tenant {tenant!r} gave up after {MAX_WRITE_ATTEMPTS} "
                        "attempts: the order kept changing under it"
                    )
            applied = rule(_order(seen))
            if applied.result.get("status") != "ok":
                if fresh:
                    return dict(applied.result), False  # a refusal stores nothing
                seen = None  # refused on remembered bytes: only a read may refuse
                continue
            reply = self._compare_and_set(
                one, field=field, order_id=order_id, seen=seen, call=call, applied=applied
            )
            if not isinstance(reply, _Changed):
                return reply
            if fresh:  # another write won the race since this call's read: let it get ahead
                time.sleep(random.uniform(0, CONTENTION_PAUSE_S * attempt))
            # The order as the compare found it (None: gone, or the shop never seeded, which
            # only a read seeds), fresh, with no done record.
            seen, fresh = reply.now, reply.now is not None

    def _compare_and_set(
        self,
        one: ShopKeys,
        *,
        field: str,
        order_id: str,
        seen: bytes | str | None,
        call: str,
        applied: Applied,
    ) -> tuple[dict[str, Any], bool] | _Changed:
        """The second round trip (the only one when `seen` was remembered). `_Changed` with
        the order as it is when it is no longer `seen`."""
        order = b"" if applied.order is None else msgspec.json.encode(applied.order)
        reply = scripts.call_script(
            self.client,
            self._write,
            list(one),
            [
                field,
                order_id,
                b"" if seen is None else seen,
                msgspec.json.encode(_Done(call=call, result=applied.result)),
                order,
                b"" if applied.effect is None else msgspec.json.encode(applied.effect),
            ],
        )
        match text(reply[0]):
            case "stored":
                if applied.order is not None:
                    self._remember(one.orders, order_id, order)
                return dict(applied.result), False
            case "replay":
                done = msgspec.json.decode(reply[1], type=_Done)
                return done.result, done.call != call
            case "changed":
                now = reply[1] if len(reply) > 1 and reply[1] else None
                self._remember(one.orders, order_id, now)
                return _Changed(now)
            case other:
                raise ShopError(f"shop_write replied {other!r}")
