"""Every Lua script's KEYS in one cluster slot: for each script, the keys its callers pass for
sample calls, built by the functions that build them, hash to one slot (redis-py's own slot
function). A script added to worker/store/lua/ or ledger/ fails here until its keys are listed.
On one server the eager claim also reads the queue's keys (another slot); on a cluster it does
not (see run_commit.lua, "Cluster")."""

from __future__ import annotations

from pathlib import Path

import pytest
from redis.crc import key_slot

from turnstile.ledger.keys import tenant_keys
from turnstile.ledger.scripts import OPERATIONS
from turnstile.worker.broker.message import StepMessage
from turnstile.worker.dev.shop import shop_keys
from turnstile.worker.http import keys as http_keys
from turnstile.worker.scheduling import fair
from turnstile.worker.scheduling.dispatcher import Dispatcher
from turnstile.worker.settings import Settings
from turnstile.worker.store import keys
from turnstile.worker.store.scripts import LUA

CLUSTER = Settings(redis_url="redis+cluster://127.0.0.1:7000", broker_url="redis://127.0.0.1:1/0")
ONE_SERVER = Settings(redis_url="redis://127.0.0.1:6379/0")
ENDPOINT = "openai:gpt-4.1-mini"  # a rate-limited endpoint: its buckets are in its own slot
TENANTS = ["acme", "t-1", "a{b}c", "x" * 64]
QUEUES = ["turnstile", "q-urgent"]
LIBRARIES = {
    "fair_lib",
    "run_lib",
    "rl_lib",
}  # function libraries, put in front of a script: no KEYS


def _slots(script_keys: list[str]) -> set[int]:
    return {key_slot(k.encode()) for k in script_keys}


def _commit_keys(tenant: str, queue: str, config: Settings) -> list[str]:
    """run_commit.lua's KEYS as RunStore.commit passes them for a turn whose commit queues the
    next step and asks to claim it (the longest list it takes)."""
    msg = StepMessage(tenant, "run-1", 3, queue, "")
    pending = fair.pending_entry(msg, 60.0, 90.0)
    claim = fair.claim(msg, 90.0, config, "token")
    return [
        keys.run(tenant, "run-1"), keys.events(tenant, "run-1"), keys.leases(tenant),
        keys.by_status(tenant, "running"), keys.by_status(tenant, "stopped"),
        keys.by_outcome(tenant, "completed"), keys.inflight(tenant), *keys.ledger(tenant),
        *pending.keys, *claim.keys,
    ]  # fmt: skip


def calls(tenant: str, queue: str) -> dict[str, list[str]]:
    """Each script's KEYS for a sample call by `tenant` on `queue`, as its caller builds them."""
    run = "run-1"
    first = fair.pending_entry(StepMessage(tenant, run, 1, queue, ""), 60.0, 90.0)
    return {
        "run_create": [keys.run(tenant, run), keys.events(tenant, run), keys.runs(tenant),
                       keys.by_status(tenant, "running"), keys.leases(tenant),
                       keys.conversation(tenant, "c-1"), keys.conversation_waiting(tenant, "c-1"),
                       keys.run(tenant, "run-0"), keys.run(tenant, "run-0"),
                       keys.events(tenant, "run-0"), keys.by_status(tenant, "waiting")],
        "run_load": [keys.run(tenant, run), keys.leases(tenant), keys.control(tenant),
                     keys.inflight(tenant), *keys.ledger(tenant)],
        "run_renew": [keys.leases(tenant), keys.inflight(tenant)],
        "run_commit": _commit_keys(tenant, queue, CLUSTER),
        "run_hold": [keys.run(tenant, run), *keys.ledger(tenant)],
        "run_mark": [keys.run(tenant, run), keys.events(tenant, run)],
        "run_expire": [keys.run(tenant, run), keys.events(tenant, run), keys.runs(tenant),
                       keys.by_status(tenant, "stopped"), keys.by_outcome(tenant, "none"),
                       keys.leases(tenant), keys.inflight(tenant)],
        "fair_push": [*first.keys, first.run_key],
        "fair_due": [keys.deferred(tenant)],
        "rl_draw": [keys.rate_bucket(ENDPOINT), keys.rate_bucket(ENDPOINT, tenant),
                    keys.rate_paid(ENDPOINT)],
        "rl_adjust": [keys.rate_bucket(ENDPOINT), keys.rate_bucket(ENDPOINT, tenant)],
        "fair_take": Dispatcher._take_keys(None, tenant, queue),  # type: ignore[arg-type]
        "rate": [http_keys.rate("key-1", 123)],
        "streams": [http_keys.streams("key-1")],
        "webhook_add": [http_keys.tenant_webhooks(tenant), http_keys.cursor(tenant)],
        "webhook_queue": [http_keys.tenant_webhooks(tenant),
                          *http_keys.endpoint_queue(tenant, "wh_0123456789abcdef")],
        "shop_read": list(shop_keys(tenant, "a-{shop}"))[:2],  # the tenant's slot, whatever
        "shop_write": list(shop_keys(tenant, "a-{shop}")),  # braces the shop's name has
        **{f"ledger.{op}": tenant_keys(tenant) for op in OPERATIONS},
    }  # fmt: skip


@pytest.mark.parametrize("queue", QUEUES)
@pytest.mark.parametrize("tenant", TENANTS)
def test_every_scripts_keys_hash_to_one_slot(tenant: str, queue: str) -> None:
    for script, script_keys in calls(tenant, queue).items():
        assert len(_slots(script_keys)) == 1, (script, script_keys)


def test_every_script_is_audited() -> None:
    scripts = {p.stem for p in Path(LUA).glob("*.lua")} - LIBRARIES
    audited = {name for name in calls("t", "q") if not name.startswith("ledger.")}
    assert scripts == audited, f"list the keys of {sorted(scripts - audited)} in calls()"
    ledger_files = {p.stem for p in (Path(LUA).parents[2] / "ledger").glob("*.lua")} - {"lib"}
    assert ledger_files == set(OPERATIONS)


@pytest.mark.parametrize("tenant", TENANTS)
def test_the_eager_claim_reads_the_queue_in_the_script_only_on_one_server(tenant: str) -> None:
    """On one server the commit's claim reads the queue's keys in the script; on a cluster
    those are read before the commit (`queue_allows`) and the script takes the tenant's only."""
    on_cluster = fair.claim(StepMessage(tenant, "r", 2, "q", ""), 90.0, CLUSTER, "tok")
    alone = fair.claim(StepMessage(tenant, "r", 2, "q", ""), 90.0, ONE_SERVER, "tok")
    assert on_cluster.queue_allows is not None and alone.queue_allows is None
    # The tenant's control and caps and its pending first steps; "1" (split), then the aging.
    assert len(on_cluster.keys) == 3 and on_cluster.args[-2] == "1"
    assert len(_slots(_commit_keys(tenant, "q", ONE_SERVER))) > 1  # a single server's only
    assert len(_slots(_commit_keys(tenant, "q", CLUSTER))) == 1
