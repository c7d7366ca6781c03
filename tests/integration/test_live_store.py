"""The worker's live sink on a real store: what it writes is batched, bounded and expiring,
and a turn's later attempt says the earlier one's words are abandoned before its own."""

from __future__ import annotations

import time

import redis

from turnstile.worker.runtime.live import StoreSink
from turnstile.worker.settings import Settings
from turnstile.worker.store import keys, live
from turnstile.worker.store.live import Cursor


def test_a_run_nobody_reads_costs_the_store_the_bound_and_expires(
    redis_url: str, unique: str
) -> None:
    """Thousands of entries written and never read: the stream holds about the bound (MAXLEN ~
    trims whole nodes), carries a time to live, and a reader finds the newest in order."""
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    settings = Settings(redis_url=redis_url, live_max_entries=50, live_flush_chars=10)
    sink = StoreSink(client, settings, tenant=f"t-{unique}", run_id=f"r-{unique}", turn=1,
                     attempt=1)  # fmt: skip
    for n in range(3000):
        sink.progress("t1.c1", "crawl", f"page {n}")
        if n % 100 == 99:
            sink.flush()
    sink.close()
    key = keys.live(f"t-{unique}", f"r-{unique}")
    assert live.length(client, f"t-{unique}", f"r-{unique}") <= 50 + 100
    assert 0 < client.ttl(key) <= settings.max_deadline_s + settings.retain_finished_s
    entries = live.read(client, f"t-{unique}", f"r-{unique}", Cursor(), count=500, block_ms=None)
    assert entries[-1].data["note"] == "page 2999" and entries[-1].live
    client.close()


def test_words_are_batched_and_a_later_attempt_abandons_the_earlier(
    redis_url: str, unique: str
) -> None:
    """Words said one by one arrive in a few entries (the timer's 30 ms, or enough words); a
    second attempt of the same turn writes `abandoned` for the first before its own words."""
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    settings = Settings(redis_url=redis_url)
    tenant, run_id = f"t-{unique}", f"r-{unique}"
    first = StoreSink(client, settings, tenant=tenant, run_id=run_id, turn=3, attempt=1)
    for word in ["one", "two", "three", "four"]:
        first.text(f"{word} ")
    time.sleep(0.2)  # the timer writes them; the attempt then dies without a close
    second = StoreSink(client, settings, tenant=tenant, run_id=run_id, turn=3, attempt=2)
    second.text("again")
    second.close()
    entries = live.read(client, tenant, run_id, Cursor(), count=100, block_ms=None)
    said = [(e.type, e.data["attempt"], e.data.get("text")) for e in entries]
    assert said == [("text", 1, "one two three four "), ("abandoned", 1, None),
                    ("text", 2, "again")]  # fmt: skip
    client.close()
