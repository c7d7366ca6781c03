"""The Redis shop against a real server: the same behaviour as the in-memory shop, in two round
trips at most per write, and exactly-once writes across processes."""

from __future__ import annotations

import multiprocessing
import queue
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import msgspec
import pytest
import redis

from turnstile.jobs.support.shop import (
    Applied,
    InMemoryShop,
    Order,
    ShopBackend,
    demo_orders,
    refund,
    status_email,
)
from turnstile.worker.dev import shop as shop_module
from turnstile.worker.dev.embedded import EmbeddedServer
from turnstile.worker.dev.shop import RedisShop, ShopContention, ShopError, shop_keys
from turnstile.worker.store import scripts

pytestmark = pytest.mark.integration

TENANT = "t-shop"  # the tenant of every shop here but the tests of tenants' shops
ANA = "cu_ana"
SMALL = "ord_1001"  # 4200 cents
LARGE = "ord_1004"  # 15000 cents

Rule = Callable[[Order | None], Applied]


def refund_rule(
    amount_cents: int, *, order_id: str = SMALL, user_id: str = ANA, approved: bool = False
) -> Rule:
    return partial(
        refund, user_id=user_id, order_id=order_id, amount_cents=amount_cents, approved=approved
    )


def email_rule(order_id: str = SMALL, user_id: str = ANA) -> Rule:
    return partial(status_email, user_id=user_id, order_id=order_id)


class CountingRedis(redis.Redis):
    """The real client, counting the commands it sends: each one is a round trip."""

    sent: list[str]

    def execute_command(self, *args: Any, **options: Any) -> Any:
        self.sent.append(str(args[0]))
        return super().execute_command(*args, **options)  # type: ignore[no-untyped-call]


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    with redis.Redis.from_url(redis_url) as client:
        yield client


@pytest.fixture(params=["memory", "redis"])
def backend(request: pytest.FixtureRequest, client: redis.Redis) -> ShopBackend:
    """Each behaviour test runs against both stores: they must agree."""
    if request.param == "memory":
        return InMemoryShop()
    return RedisShop(client)


def orders_of(backend: ShopBackend, shop: str) -> dict[str, Order]:
    assert isinstance(backend, InMemoryShop | RedisShop)
    return backend.orders(TENANT, shop)


# -- the same behaviour as InMemoryShop ----------------------------------------------------------


def test_a_new_shop_has_the_demo_orders(backend: ShopBackend, unique: str) -> None:
    """The first touch seeds the demo orders; an unknown order is None; no effects yet."""
    assert backend.get_order(TENANT, unique, SMALL) == demo_orders()[SMALL]
    assert backend.get_order(TENANT, unique, "ord_9999") is None
    assert orders_of(backend, unique) == demo_orders()
    assert backend.effects(TENANT, unique) == []


def test_another_customers_order_is_not_found_and_nothing_is_stored(
    backend: ShopBackend, unique: str
) -> None:
    """A write to someone else's order, or to no order, is not_found and stores nothing, so the
    same key still works for a write that is allowed."""
    rule = refund_rule(100, user_id="cu_ben")
    assert backend.write_once(
        TENANT, unique, key="k1", name="issue_refund", order_id=SMALL, rule=rule
    ) == (
        {"status": "error", "code": "not_found"},
        False,
    )
    missing = refund_rule(100, order_id="ord_9999")
    assert backend.write_once(
        TENANT, unique, key="k1", name="issue_refund", order_id="ord_9999", rule=missing
    ) == ({"status": "error", "code": "not_found"}, False)
    assert backend.effects(TENANT, unique) == []
    assert backend.write_once(
        TENANT, unique, key="k1", name="issue_refund", order_id=SMALL, rule=refund_rule(100)
    ) == ({"status": "ok", "refunded_cents": 100}, False)


def test_refund_over_the_refundable_amount_is_invalid_state(
    backend: ShopBackend, unique: str
) -> None:
    """More than what is left to refund is refused and changes nothing."""
    result = backend.write_once(
        TENANT, unique, key="k1", name="issue_refund", order_id=SMALL, rule=refund_rule(4201)
    )
    assert result == (
        {"status": "error", "code": "invalid_state", "detail": "amount exceeds refundable"},
        False,
    )
    assert orders_of(backend, unique) == demo_orders()
    assert backend.effects(TENANT, unique) == []


def test_a_large_refund_needs_approval_then_the_same_key_goes_through(
    backend: ShopBackend, unique: str
) -> None:
    """Above 5000 cents without approval: needs_approval, nothing stored; the same key, now
    approved, refunds once; a third call is a replay."""
    ask = refund_rule(6000, order_id=LARGE)
    assert backend.write_once(
        TENANT, unique, key="k1", name="issue_refund", order_id=LARGE, rule=ask
    ) == (
        {"status": "needs_approval"},
        False,
    )
    assert orders_of(backend, unique) == demo_orders()
    assert backend.effects(TENANT, unique) == []
    approved = refund_rule(6000, order_id=LARGE, approved=True)
    for replayed in (False, True):
        assert backend.write_once(
            TENANT, unique, key="k1", name="issue_refund", order_id=LARGE, rule=approved
        ) == ({"status": "ok", "refunded_cents": 6000}, replayed)
    assert backend.effects(TENANT, unique) == [["refund", LARGE, 6000]]
    order = backend.get_order(TENANT, unique, LARGE)
    assert order is not None and order.refunded_cents == 6000


def test_a_replay_returns_the_stored_result_and_adds_no_effect(
    backend: ShopBackend, unique: str
) -> None:
    """The same (key, name) again returns what the first call stored, even if the rule would
    now answer otherwise, and the world does not change."""
    first = backend.write_once(
        TENANT, unique, key="k1", name="issue_refund", order_id=SMALL, rule=refund_rule(1000)
    )
    assert first == ({"status": "ok", "refunded_cents": 1000}, False)
    again = backend.write_once(
        TENANT, unique, key="k1", name="issue_refund", order_id=SMALL, rule=refund_rule(4000)
    )
    assert again == ({"status": "ok", "refunded_cents": 1000}, True)
    assert backend.effects(TENANT, unique) == [["refund", SMALL, 1000]]
    order = backend.get_order(TENANT, unique, SMALL)
    assert order is not None and order.refunded_cents == 1000


def test_the_same_key_under_another_name_is_another_write(
    backend: ShopBackend, unique: str
) -> None:
    """Writes are remembered per (key, name): one key may carry a refund and an email."""
    backend.write_once(
        TENANT, unique, key="k1", name="issue_refund", order_id=SMALL, rule=refund_rule(10)
    )
    result = backend.write_once(
        TENANT, unique, key="k1", name="send_status_email", order_id=SMALL, rule=email_rule()
    )
    assert result == ({"status": "ok", "sent": True}, False)
    assert backend.effects(TENANT, unique) == [["refund", SMALL, 10], ["email", SMALL]]


def test_an_email_is_an_effect_and_leaves_the_order_alone(
    backend: ShopBackend, unique: str
) -> None:
    """An email goes to the effects log once; the order does not change."""
    for replayed in (False, True):
        assert backend.write_once(
            TENANT, unique, key="k1", name="send_status_email", order_id=SMALL, rule=email_rule()
        ) == ({"status": "ok", "sent": True}, replayed)
    assert backend.effects(TENANT, unique) == [["email", SMALL]]
    assert orders_of(backend, unique) == demo_orders()


def test_effects_keep_the_order_writes_happened_in(backend: ShopBackend, unique: str) -> None:
    """The effects log is in write order, and each refund sees the ones before it."""
    backend.write_once(
        TENANT, unique, key="a", name="issue_refund", order_id=SMALL, rule=refund_rule(200)
    )
    backend.write_once(
        TENANT, unique, key="b", name="send_status_email", order_id=LARGE, rule=email_rule(LARGE)
    )
    third = backend.write_once(
        TENANT, unique, key="c", name="issue_refund", order_id=SMALL, rule=refund_rule(300)
    )
    assert third == ({"status": "ok", "refunded_cents": 500}, False)
    assert backend.effects(TENANT, unique) == [
        ["refund", SMALL, 200],
        ["email", LARGE],
        ["refund", SMALL, 300],
    ]


def test_shops_do_not_share_anything(backend: ShopBackend, unique: str) -> None:
    """Orders, effects and idempotency keys are per shop."""
    other = f"{unique}-other"
    backend.write_once(
        TENANT, unique, key="k1", name="issue_refund", order_id=SMALL, rule=refund_rule(100)
    )
    assert backend.write_once(
        TENANT, other, key="k1", name="issue_refund", order_id=SMALL, rule=refund_rule(100)
    ) == ({"status": "ok", "refunded_cents": 100}, False)
    assert (
        backend.effects(TENANT, unique)
        == backend.effects(TENANT, other)
        == [["refund", SMALL, 100]]
    )


# -- Redis only: keys, round trips, retries, scripts -------------------------------------------


def test_every_key_of_a_shop_shares_its_hash_tag(client: redis.Redis, unique: str) -> None:
    """All of a shop's keys are tagged with its tenant, and they are the only keys it writes."""
    shop, tenant = RedisShop(client), f"t-{unique}"
    shop.write_once(
        tenant, "s", key="k1", name="issue_refund", order_id=SMALL, rule=refund_rule(100)
    )
    keys = shop_keys(tenant, "s")
    assert all(k.startswith(f"turnstile:shop:{{{tenant}}}:s:") for k in keys)
    written = sorted(k.decode() for k in client.scan_iter(match=f"*{{{tenant}}}*"))
    assert written == sorted(keys)


def test_round_trips_per_call(redis_url: str, unique: str) -> None:
    """A fresh write costs two round trips; a replay, a refusal, a read and the effects one;
    a write to an order the shop object has read (or written) since it last changed, one."""
    with CountingRedis.from_url(redis_url) as client:
        client.sent = []
        shop, cold = RedisShop(client), RedisShop(client)
        shop.get_order(TENANT, f"{unique}-warm", SMALL)  # loads the scripts on a cold server
        shop.write_once(
            TENANT,
            f"{unique}-warm",
            key="k",
            name="issue_refund",
            order_id=SMALL,
            rule=refund_rule(1),
        )

        def cost(call: Any) -> int:
            client.sent = []
            call()
            return len(client.sent)

        write = partial(shop.write_once, TENANT, unique, name="issue_refund", order_id=SMALL)
        cold_write = partial(
            cold.write_once, TENANT, unique, name="issue_refund", order_id=SMALL
        )  # a shop object that has read nothing of this shop
        assert cost(partial(shop.get_order, TENANT, unique, SMALL)) == 1
        assert cost(partial(cold_write, key="k1", rule=refund_rule(100))) == 2
        assert cost(partial(write, key="k1", rule=refund_rule(100))) == 1  # a replay
        assert cost(partial(cold_write, key="k1", rule=refund_rule(100))) == 1  # a replay
        assert cost(partial(write, key="k2", rule=refund_rule(9999))) == 1  # a refusal
        assert cost(partial(cold_write, key="k2", rule=refund_rule(9999))) == 1  # a refusal
        assert cost(partial(write, key="k3", rule=refund_rule(100))) == 1  # read by k2's
        assert cost(partial(write, key="k4", rule=refund_rule(100))) == 1  # written by k3's
        assert cost(partial(cold_write, key="k5", rule=refund_rule(100))) == 2  # stale: reads
        assert set(client.sent) == {"EVALSHA"}
        assert shop.get_order(TENANT, unique, SMALL) == Order(
            customer=ANA, total_cents=4200, refunded_cents=400
        )
        assert cost(partial(shop.effects, TENANT, unique)) == 1
        assert cost(partial(shop.orders, TENANT, unique)) == 1


def test_a_write_that_loses_the_race_reads_again_and_applies_the_rule_anew(
    client: redis.Redis, unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When another writer changes the order between the read and the compare-and-set, nothing
    is written; the rule runs again on the new order and the write lands once."""
    monkeypatch.setattr(shop_module, "CONTENTION_PAUSE_S", 0.0)
    shop, rival = RedisShop(client), RedisShop(client)
    seen: list[int] = []

    def rule(order: Order | None) -> Applied:
        assert order is not None
        seen.append(order.refunded_cents)
        if len(seen) == 1:
            rival.write_once(
                TENANT,
                unique,
                key="rival",
                name="issue_refund",
                order_id=SMALL,
                rule=refund_rule(1000),
            )
        return refund(order, user_id=ANA, order_id=SMALL, amount_cents=3000, approved=False)

    result = shop.write_once(
        TENANT, unique, key="k1", name="issue_refund", order_id=SMALL, rule=rule
    )
    assert result == ({"status": "ok", "refunded_cents": 4000}, False)
    assert seen == [0, 1000]
    assert shop.effects(TENANT, unique) == [["refund", SMALL, 1000], ["refund", SMALL, 3000]]


def test_a_write_on_a_remembered_order_that_changed_applies_the_rule_to_the_order_as_it_is(
    client: redis.Redis, unique: str
) -> None:
    """A shop object that read the order before another one refunded it writes from what its
    compare-and-set found, not from what it remembered: the refunds add up, each once."""
    shop, rival = RedisShop(client), RedisShop(client)
    assert shop.get_order(TENANT, unique, SMALL) == demo_orders()[SMALL]  # remembered
    assert rival.write_once(
        TENANT, unique, key="rival", name="issue_refund", order_id=SMALL, rule=refund_rule(1000)
    ) == ({"status": "ok", "refunded_cents": 1000}, False)
    seen: list[int] = []

    def rule(order: Order | None) -> Applied:
        assert order is not None
        seen.append(order.refunded_cents)
        return refund(order, user_id=ANA, order_id=SMALL, amount_cents=3000, approved=False)

    assert shop.write_once(
        TENANT, unique, key="k1", name="issue_refund", order_id=SMALL, rule=rule
    ) == ({"status": "ok", "refunded_cents": 4000}, False)
    assert seen == [0, 1000]
    assert shop.effects(TENANT, unique) == [["refund", SMALL, 1000], ["refund", SMALL, 3000]]


def test_a_refusal_on_a_remembered_order_is_answered_only_after_a_read(
    client: redis.Redis, unique: str
) -> None:
    """The rule refusing the order as the shop object remembers it is not an answer: the
    order changed since (here, its total, behind every shop's back), and on the order as it
    is the refund goes through."""
    shop = RedisShop(client)
    assert shop.get_order(TENANT, unique, SMALL) == demo_orders()[SMALL]  # 4200 cents
    larger = Order(customer=ANA, total_cents=10_000)
    client.hset(shop_keys(TENANT, unique).orders, SMALL, msgspec.json.encode(larger))
    assert shop.write_once(
        TENANT, unique, key="k1", name="issue_refund", order_id=SMALL, rule=refund_rule(4500)
    ) == ({"status": "ok", "refunded_cents": 4500}, False)
    assert shop.effects(TENANT, unique) == [["refund", SMALL, 4500]]


def test_a_shop_remembers_a_bounded_number_of_orders(
    client: redis.Redis, unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past ORDERS_REMEMBERED, the order least recently read or written is forgotten: a write
    to it reads first again (two round trips), one to an order still remembered does not."""
    monkeypatch.setattr(shop_module, "ORDERS_REMEMBERED", 2)
    shop = RedisShop(client)
    for name in ("a", "b", "c"):
        shop.get_order(TENANT, f"{unique}-{name}", SMALL)
    assert len(shop._seen) == 2
    reads: list[Any] = []
    original = scripts.call_script

    def counted(client: redis.Redis, script: Any, keys: Any, args: Any) -> Any:
        if script is shop._read:
            reads.append(args)
        return original(client, script, keys, args)

    monkeypatch.setattr(scripts, "call_script", counted)
    for name, read in (("c", 0), ("a", 1)):
        shop.write_once(
            TENANT, f"{unique}-{name}", key="k", name="issue_refund", order_id=SMALL,
            rule=refund_rule(100),
        )  # fmt: skip
        assert len(reads) == read


def test_a_write_that_always_loses_gives_up_with_a_clear_error(
    client: redis.Redis, unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bounded retries: an order that changes under every attempt ends in ShopContention, and
    this call wrote nothing."""
    monkeypatch.setattr(shop_module, "CONTENTION_PAUSE_S", 0.0)
    shop, rival = RedisShop(client), RedisShop(client)
    rivals = iter(range(1000))

    def rule(order: Order | None) -> Applied:
        rival.write_once(
            TENANT,
            unique,
            key=f"r{next(rivals)}",
            name="issue_refund",
            order_id=LARGE,
            rule=refund_rule(1, order_id=LARGE),
        )
        return refund(order, user_id=ANA, order_id=LARGE, amount_cents=10, approved=False)

    with pytest.raises(ShopContention, match="gave up after 20 attempts"):
        shop.write_once(TENANT, unique, key="k1", name="issue_refund", order_id=LARGE, rule=rule)
    assert shop.effects(TENANT, unique) == [["refund", LARGE, 1]] * shop_module.MAX_WRITE_ATTEMPTS


def test_a_replay_of_this_calls_own_write_is_not_reported_as_a_replay(
    client: redis.Redis, unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """If the compare-and-set finds the record this very call stored (a client retry after a
    lost reply), the call still reports a fresh write."""
    shop = RedisShop(client)
    original = scripts.call_script
    replies: list[Any] = []

    def twice(client: redis.Redis, script: Any, keys: Any, args: Any) -> Any:
        if script is not shop._write:
            return original(client, script, keys, args)
        replies.append(original(client, script, keys, args))
        # the retry of a write whose reply was lost
        replies.append(original(client, script, keys, args))
        return replies[-1]

    monkeypatch.setattr(scripts, "call_script", twice)
    result = shop.write_once(
        TENANT, unique, key="k1", name="issue_refund", order_id=SMALL, rule=refund_rule(100)
    )
    assert [r[0] for r in replies] == [b"stored", b"replay"]
    assert result == ({"status": "ok", "refunded_cents": 100}, False)
    assert shop.effects(TENANT, unique) == [["refund", SMALL, 100]]


def test_a_name_with_the_field_separator_is_refused(client: redis.Redis, unique: str) -> None:
    """(key, name) is stored as "<key>|<name>"; a name with '|' would be ambiguous."""
    with pytest.raises(ShopError):
        RedisShop(client).write_once(
            TENANT, unique, key="k", name="a|b", order_id=SMALL, rule=email_rule()
        )


def test_scripts_survive_a_script_cache_flush(own_server: EmbeddedServer, unique: str) -> None:
    """After SCRIPT FLUSH (or a restart, or a failover) the scripts are loaded again."""
    with redis.Redis.from_url(own_server.url) as client:
        shop = RedisShop(client)
        shop.write_once(
            TENANT, unique, key="k1", name="issue_refund", order_id=SMALL, rule=refund_rule(100)
        )
        client.script_flush()
        assert shop.write_once(
            TENANT, unique, key="k2", name="issue_refund", order_id=SMALL, rule=refund_rule(100)
        ) == ({"status": "ok", "refunded_cents": 200}, False)


def test_two_tenants_shops_of_one_name_are_two_shops(
    backend: ShopBackend, client: redis.Redis, unique: str
) -> None:
    """Tenant B names tenant A's shop: it reads its own fresh orders, not A's refund, its
    refund lands in its own shop, and A's write under the same key is not B's."""
    a, b, shop = f"a-{unique}", f"b-{unique}", f"shared-{unique}"
    assert backend.write_once(
        a, shop, key="k1", name="issue_refund", order_id=SMALL, rule=refund_rule(3000)
    ) == ({"status": "ok", "refunded_cents": 3000}, False)
    assert backend.get_order(b, shop, SMALL) == demo_orders()[SMALL]
    assert not backend.done(b, shop, "k1", "issue_refund")
    assert backend.write_once(
        b, shop, key="k1", name="issue_refund", order_id=SMALL, rule=refund_rule(3000)
    ) == ({"status": "ok", "refunded_cents": 3000}, False)
    assert backend.effects(a, shop) == backend.effects(b, shop) == [["refund", SMALL, 3000]]
    for tenant in (a, b):
        order = backend.get_order(tenant, shop, SMALL)
        assert order is not None and order.refunded_cents == 3000
    if isinstance(backend, RedisShop):  # the keys themselves carry the tenant's hash tag
        assert {k.decode() for k in client.scan_iter(match=f"*{shop}*")} == {
            *shop_keys(a, shop),
            *shop_keys(b, shop),
        }
        assert all(k.startswith(f"turnstile:shop:{{{a}}}:") for k in shop_keys(a, shop))


# -- across processes --------------------------------------------------------------------------

WORKERS = 4


def _refund_many(
    url: str, shop: str, *, keys: list[str], amount_cents: int, start: Any, out: Any
) -> None:
    """One worker process: refund under each key in turn, report every answer."""
    with redis.Redis.from_url(url) as client:
        backend = RedisShop(client)
        start.wait(timeout=60)
        answers = [
            (
                key,
                *backend.write_once(
                    TENANT,
                    shop,
                    key=key,
                    name="issue_refund",
                    order_id=SMALL,
                    rule=refund_rule(amount_cents),
                ),
            )
            for key in keys
        ]
    out.put(answers)


def run_workers(
    redis_url: str, shop: str, keys_of: list[list[str]], amount_cents: int
) -> list[tuple[str, dict[str, Any], bool]]:
    ctx = multiprocessing.get_context("forkserver")
    # Fork from a single-threaded server that has imported this module once: each worker then
    # starts in milliseconds, and no worker inherits the test process's threads or sockets.
    ctx.set_forkserver_preload([__name__])
    start = ctx.Barrier(len(keys_of))
    out = ctx.Queue()
    workers = [
        ctx.Process(
            target=_refund_many,
            args=(redis_url, shop),
            kwargs={"keys": keys, "amount_cents": amount_cents, "start": start, "out": out},
        )
        for keys in keys_of
    ]
    for w in workers:
        w.start()
    answers: list[tuple[str, dict[str, Any], bool]] = []
    try:
        for _ in workers:
            answers.extend(out.get(timeout=120))
    except queue.Empty:
        pytest.fail("a worker process did not report")
    finally:
        for w in workers:
            w.join(timeout=30)
    assert [w.exitcode for w in workers] == [0] * len(workers)
    return answers


@pytest.mark.parametrize(
    "case", [(3000, 10, 1), (100, 15, 42)], ids=["3000-cents-one-fits", "100-cents-42-fit"]
)
def test_concurrent_refunds_under_different_keys_never_overdraw(
    redis_url: str, client: redis.Redis, unique: str, case: tuple[int, int, int]
) -> None:
    """Four processes refunding the same 4200-cent order at once, each under keys of its own:
    exactly as many refunds succeed as fit, each saw the ones before it, and the effects are
    exactly those refunds."""
    amount_cents, attempts_each, successes = case
    keys_of = [[f"w{w}-{i}" for i in range(attempts_each)] for w in range(WORKERS)]
    answers = run_workers(redis_url, unique, keys_of, amount_cents)
    shop = RedisShop(client)
    ok = [result for _, result, _ in answers if result["status"] == "ok"]
    refused = [result for _, result, _ in answers if result["status"] != "ok"]
    assert len(ok) == successes
    assert sorted(r["refunded_cents"] for r in ok) == [
        amount_cents * n for n in range(1, successes + 1)
    ]
    assert all(r["code"] == "invalid_state" for r in refused)
    assert not any(replayed for _, _, replayed in answers)
    order = shop.get_order(TENANT, unique, SMALL)
    assert (
        order is not None and order.refunded_cents == amount_cents * successes <= order.total_cents
    )
    assert shop.effects(TENANT, unique) == [["refund", SMALL, amount_cents]] * successes


def test_concurrent_writes_under_the_same_key_happen_once(
    redis_url: str, client: redis.Redis, unique: str
) -> None:
    """Four processes sending the same writes (same keys) at once: each key is one refund and
    one effect; everyone gets the same result; exactly one caller per key is not a replay."""
    keys = [f"k{i}" for i in range(20)]
    answers = run_workers(redis_url, unique, [keys] * WORKERS, 100)
    assert len(answers) == WORKERS * len(keys)
    for key in keys:
        mine = [(result, replayed) for k, result, replayed in answers if k == key]
        assert len({str(result) for result, _ in mine}) == 1
        assert sorted(replayed for _, replayed in mine) == [False, True, True, True]
    shop = RedisShop(client)
    order = shop.get_order(TENANT, unique, SMALL)
    assert order is not None and order.refunded_cents == 100 * len(keys)
    assert shop.effects(TENANT, unique) == [["refund", SMALL, 100]] * len(keys)
    assert len(client.hkeys(shop_keys(TENANT, unique).done)) == len(keys)
