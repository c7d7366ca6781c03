"""The shared buckets of provider rate limits, on a real server: what a draw answers, the debt
deferred turns take, a paid step, a tenant's own share, a 429's block, the refund, the
deadline's cut-off, the dispatcher's queueing of due steps, and the operator's bad input."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
import redis

from turnstile.providers.config import ProviderConfig
from turnstile.worker.broker.message import StepMessage
from turnstile.worker.scheduling import ratelimits
from turnstile.worker.scheduling.ratelimits import Buckets, Promoter, RateLimitError
from turnstile.worker.store import keys

pytestmark = pytest.mark.integration

HOUR_MS = 3_600_000
BUILT_IN = ProviderConfig()  # the endpoints here are the built-in providers' models


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(redis_url, decode_responses=True)
    yield c
    c.close()


def _endpoint(unique: str) -> str:
    return f"openai:model-{unique}"


def test_a_bucket_lets_its_burst_through_then_defers_each_turn_for_its_own_turn(
    client: redis.Redis, unique: str
) -> None:
    """rpm=60 burst_s=3: three turns go at once; the fourth waits one refill (a request every
    61/58 s: 60 - 3 + 1 in 61 s), the fifth two (the deferred turn drew already), and the
    deferred turn's next step then goes without drawing. `limits show` never says below 0."""
    endpoint = _endpoint(unique)
    ratelimits.set_limits(client, endpoint, {"rpm": 60, "burst_s": 3}, providers=BUILT_IN)
    b = Buckets(client)
    assert b.limited(endpoint)
    for n in range(3):
        assert b.draw(endpoint, "t", f"r{n}", 1, tokens=100, longest_ms=HOUR_MS).kind == "go"
    fourth = b.draw(endpoint, "t", "r3", 1, tokens=100, longest_ms=HOUR_MS)
    fifth = b.draw(endpoint, "t", "r4", 1, tokens=100, longest_ms=HOUR_MS)
    refill_ms = 61_000 / 58
    assert (fourth.kind, fourth.which) == ("wait", "rpm")
    assert refill_ms - 100 <= fourth.wait_ms <= refill_ms + 1
    assert 2 * refill_ms - 100 <= fifth.wait_ms <= 2 * refill_ms + 1
    # r3's next step (version 2) drew when r3 was deferred: it goes, and takes nothing more.
    assert b.draw(endpoint, "t", "r3", 2, tokens=100, longest_ms=HOUR_MS).kind == "go"
    [view] = ratelimits.show_limits(client, endpoint, providers=BUILT_IN)
    assert (view.rpm, view.burst_s, view.requests_left) == (60, 3, 0.0)  # in debt: shown as 0
    assert view.deferred == 1  # r4's next step


def test_the_default_burst_is_a_seconds_worth_and_one_request_at_least(
    client: redis.Redis, unique: str
) -> None:
    """rpm=40 with no burst given: one request goes (40/60 of one, at least one), the next
    waits 61/40 s; rpm=600: ten go at once."""
    small, large = _endpoint(f"{unique}-40"), _endpoint(f"{unique}-600")
    ratelimits.set_limits(client, small, {"rpm": 40}, providers=BUILT_IN)
    ratelimits.set_limits(client, large, {"rpm": 600}, providers=BUILT_IN)
    b = Buckets(client)
    assert b.draw(small, "t", "a", 1, tokens=1, longest_ms=HOUR_MS).kind == "go"
    second = b.draw(small, "t", "b", 1, tokens=1, longest_ms=HOUR_MS)
    assert second.kind == "wait" and 61_000 / 40 - 100 <= second.wait_ms <= 61_000 / 40 + 1
    kinds = [b.draw(large, "t", f"r{n}", 1, tokens=1, longest_ms=HOUR_MS).kind for n in range(11)]
    assert kinds == ["go"] * 10 + ["wait"]
    shown = {v.endpoint: v.burst_s for v in ratelimits.show_limits(client, providers=BUILT_IN)}
    assert shown[small] == shown[large] == ratelimits.DEFAULT_BURST_S == 1


def test_a_wait_past_the_deadline_draws_nothing(client: redis.Redis, unique: str) -> None:
    endpoint = _endpoint(unique)
    ratelimits.set_limits(client, endpoint, {"rpm": 1}, providers=BUILT_IN)
    b = Buckets(client)
    assert b.draw(endpoint, "t", "a", 1, tokens=1, longest_ms=HOUR_MS).kind == "go"
    late = b.draw(endpoint, "t", "b", 1, tokens=1, longest_ms=5_000)
    assert (late.kind, late.which) == ("late", "rpm") and late.wait_ms > 5_000
    again = b.draw(endpoint, "t", "c", 1, tokens=1, longest_ms=HOUR_MS)
    assert again.kind == "wait" and abs(again.wait_ms - late.wait_ms) < 1_000  # b took nothing
    assert client.zscore(keys.rate_paid(endpoint), "t|b:2") is None


def test_tokens_per_minute_defer_a_large_turn_and_a_refund_gives_back_the_unused(
    client: redis.Redis, unique: str
) -> None:
    """tpm=6000 burst_s=30: a bucket of 3000 tokens refilled at 3001 per 61 s. A turn of 5000
    goes on a full bucket (a turn larger than the burst waits for a full one) and leaves a
    debt; the next waits for the debt and a full bucket; a refund of the unused gives back."""
    endpoint = _endpoint(unique)
    ratelimits.set_limits(client, endpoint, {"tpm": 6000, "burst_s": 30}, providers=BUILT_IN)
    b = Buckets(client)
    assert b.draw(endpoint, "t", "a", 1, tokens=5000, longest_ms=HOUR_MS).kind == "go"
    big = b.draw(endpoint, "t", "b", 1, tokens=5000, longest_ms=HOUR_MS)
    assert (big.kind, big.which) == ("wait", "tpm")
    full_ms = 5000 * 61_000 / 3001  # from -2000 to 3000
    assert full_ms - 200 <= big.wait_ms <= full_ms + 1
    b.refund(endpoint, "t", 8000)  # both turns used 1000 of their 5000: -7000 + 8000
    assert b.draw(endpoint, "t", "c", 1, tokens=1000, longest_ms=HOUR_MS).kind == "go"
    [view] = ratelimits.show_limits(client, endpoint, providers=BUILT_IN)
    assert view.tokens_left is not None and 0 <= view.tokens_left < 3000


def test_a_tenants_own_share_defers_its_turns_and_not_the_others(
    client: redis.Redis, unique: str
) -> None:
    endpoint = _endpoint(unique)
    ratelimits.set_limits(client, endpoint, {"rpm": 100, "burst_s": 30}, providers=BUILT_IN)
    ratelimits.set_limits(client, endpoint, {"rpm": 1}, tenant=f"acme-{unique}", providers=BUILT_IN)
    b = Buckets(client)
    assert b.draw(endpoint, f"acme-{unique}", "a1", 1, tokens=1, longest_ms=HOUR_MS).kind == "go"
    second = b.draw(endpoint, f"acme-{unique}", "a2", 1, tokens=1, longest_ms=HOUR_MS)
    assert (second.kind, second.which) == ("wait", "tenant.rpm")
    assert b.draw(endpoint, f"other-{unique}", "o1", 1, tokens=1, longest_ms=HOUR_MS).kind == "go"
    shown = {
        (v.endpoint, v.tenant, v.rpm)
        for v in ratelimits.show_limits(client, endpoint, providers=BUILT_IN)
    }
    assert shown == {(endpoint, "", 100), (endpoint, f"acme-{unique}", 1)}


def test_a_429_blocks_every_draw_until_its_wait_is_over_then_the_bucket_refills_from_empty(
    client: redis.Redis, unique: str
) -> None:
    """The block is in the store: a second process's buckets see it. A paid step that finds
    the block waits it out, still paid."""
    endpoint = _endpoint(unique)
    ratelimits.set_limits(client, endpoint, {"rpm": 6000}, providers=BUILT_IN)
    first, second = Buckets(client), Buckets(client)
    assert first.draw(endpoint, "t", "a", 1, tokens=1, longest_ms=HOUR_MS).kind == "go"
    first.block(endpoint, 2.0)
    blocked = second.draw(endpoint, "t", "b", 1, tokens=1, longest_ms=HOUR_MS)
    assert (blocked.kind, blocked.which) == ("wait", "429")
    assert 1_500 <= blocked.wait_ms <= 2_001  # the server clock read in whole ms, twice
    # b's next step is paid; it comes early, during the block: it waits the block out.
    early = second.draw(endpoint, "t", "b", 2, tokens=1, longest_ms=HOUR_MS)
    assert early.kind == "wait" and early.which == "429"
    time.sleep(2.2)
    assert second.draw(endpoint, "t", "b", 3, tokens=1, longest_ms=HOUR_MS).kind == "go"
    # A 429 on an endpoint without limits changes nothing: Turnstile does not manage it.
    other = f"openai:free-{unique}"
    first.block(other, 5.0)
    assert not client.exists(keys.rate_bucket(other))


def test_limits_unset_removes_them_and_a_turn_then_draws_nothing(
    client: redis.Redis, unique: str
) -> None:
    endpoint = _endpoint(unique)
    ratelimits.set_limits(client, endpoint, {"rpm": 1, "tpm": 10}, providers=BUILT_IN)
    assert ratelimits.unset_limits(client, endpoint, ["tpm"], providers=BUILT_IN) == ["tpm"]
    assert endpoint in client.smembers(keys.RATE_ENDPOINTS)
    assert ratelimits.unset_limits(client, endpoint, providers=BUILT_IN) == ["rpm"]
    assert endpoint not in client.smembers(keys.RATE_ENDPOINTS)
    assert not Buckets(client).limited(endpoint)
    assert ratelimits.show_limits(client, endpoint, providers=BUILT_IN) == []


@pytest.mark.parametrize(
    ("endpoint", "pairs", "said"),
    [
        ("openai:gpt-4.1-mini", ["rpm=0"], "rpm must be a whole number from 1"),
        ("openai:gpt-4.1-mini", ["rpm=-5"], "rpm must be a whole number from 1"),
        ("openai:gpt-4.1-mini", ["tpm=lots"], "tpm must be a whole number from 1"),
        ("openai:gpt-4.1-mini", ["tpm=1.5"], "tpm must be a whole number from 1"),
        ("openai:gpt-4.1-mini", ["rps=3"], "bad limit 'rps=3'"),
        ("openai:gpt-4.1-mini", [], "nothing to set"),
        ("openai:gpt-4.1-mini", ["rpm=5", "burst_s=31"], "burst_s must be a whole number from 0"),
        ("openai:gpt-4.1-mini", ["rpm=5", "burst_s=-1"], "burst_s must be a whole number from 0"),
        ("openai:gpt-4.1-mini", ["rpm=5", "burst_s=0.5"], "burst_s must be a whole number"),
        ("openai:nothing-set-here", ["burst_s=5"], "burst_s alone limits nothing"),
        ("gemini:pro", ["rpm=5"], "unknown endpoint 'gemini:pro'"),
        ("not a model", ["rpm=5"], "bad endpoint 'not a model': provider:model"),
        ("openai:{x}", ["rpm=5"], "bad endpoint"),
        ("openai:gpt\x00\x1b", ["rpm=5"], "bad endpoint"),
    ],
)
def test_a_limit_that_is_not_one_is_refused_with_nothing_written(
    client: redis.Redis, endpoint: str, pairs: list[str], said: str
) -> None:
    before = client.smembers(keys.RATE_ENDPOINTS)
    with pytest.raises(RateLimitError, match=said):
        ratelimits.set_limits(client, endpoint, ratelimits.parse_limits(pairs), providers=BUILT_IN)
    assert client.smembers(keys.RATE_ENDPOINTS) == before
    assert not client.exists(keys.rate_bucket(endpoint))


def test_the_dispatcher_queues_a_deferred_step_once_it_is_due_and_not_before(
    client: redis.Redis, unique: str
) -> None:
    tenant, queue = f"t-{unique}", f"q-{unique}"
    msg = StepMessage(tenant, "run-1", 3, queue)
    ratelimits.defer(client, msg, 10.0, 20.0, 600)
    promoter = Promoter(client)
    soonest = promoter.promote()
    assert soonest is not None and 0 < soonest <= 0.6
    assert client.zcard(keys.pending(tenant, queue, "cont")) == 0
    time.sleep(soonest + 0.05)
    assert promoter.promote() == 0.0
    [entry] = client.zrange(keys.pending(tenant, queue, "cont"), 0, -1)
    assert {k: json.loads(str(entry))[k] for k in ("run_id", "version", "hard_s")} == {
        "run_id": "run-1", "version": 3, "hard_s": 20.0,
    }  # fmt: skip
    assert tenant in client.smembers(keys.fair_active(queue))
    assert promoter.promote() is None or tenant not in client.smembers(keys.DEFERRED_TENANTS)
    assert tenant not in client.smembers(keys.DEFERRED_TENANTS)
