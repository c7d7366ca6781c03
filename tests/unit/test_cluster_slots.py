"""Every Lua script's KEYS in one cluster slot (redis-py's own slot function). The run store's
scripts are checked on the keys it sends: its calls for a run's life, recorded off a real
server (MONITOR). The others' keys for sample calls are built by the functions their callers
build them with. A script added to worker/store/lua/ or ledger/ fails here until its keys are
checked. On one server the eager claim also reads the queue's keys (another slot); on a
cluster it does not (see run_commit.lua, "Cluster")."""

from __future__ import annotations

import codecs
import contextlib
import re
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from redis.commands.core import Script
from redis.crc import key_slot

from tests.integration.workers import client_for
from turnstile.jobs.support.scenarios import GOAL, USER
from turnstile.ledger.client import Ledger
from turnstile.ledger.keys import tenant_keys
from turnstile.ledger.scripts import OPERATIONS
from turnstile.worker.broker.message import StepMessage
from turnstile.worker.dev.shop import shop_keys
from turnstile.worker.registry import Registry
from turnstile.worker.scheduling import fair
from turnstile.worker.settings import Settings
from turnstile.worker.store import api_limits, keys, limits, outbox, pending, webhooks
from turnstile.worker.store.run_calls import expire_call
from turnstile.worker.store.runs import Change, RunStore
from turnstile.worker.store.scripts import LUA

CLUSTER = Settings(redis_url="redis+cluster://127.0.0.1:7000", broker_url="redis://127.0.0.1:1/0")
ONE_SERVER = Settings(redis_url="redis://127.0.0.1:6379/0")
ENDPOINT = "openai:gpt-4.1-mini"  # a rate-limited endpoint: its buckets are in its own slot
WEBHOOK = "wh_0123456789abcdef"
DELIVERY = outbox.Delivery("dlv_1", WEBHOOK, "run.finished", "{}", 0)
TENANTS = ["acme", "t-1", "a{b}c", "x" * 64]
QUEUES = ["turnstile", "q-urgent"]
LIBRARIES = {
    "fair_lib",
    "run_lib",
    "rl_lib",
}  # function libraries, put in front of a script: no KEYS
# Scripts that run on the Redis broker, never the store: kombu's keys (`unacked`, the queues'
# lists) on the one server its Redis transport supports (no cluster), in no one slot.
BROKER_ONLY = {"broker_take", "broker_ack"}


def _slots(script_keys: list[str]) -> set[int]:
    return {key_slot(k.encode()) for k in script_keys}


def calls(tenant: str, queue: str) -> dict[str, list[str]]:
    """The KEYS of each script the run store does not send, for a sample call by `tenant` on
    `queue`, as its caller builds them."""
    run = "run-1"
    first = fair.pending_entry(StepMessage(tenant, run, 1, queue, ""), 60.0, 90.0)
    return {
        "run_expire": expire_call(tenant, run, outcome="", cutoff_ms=0).keys,
        "fair_push": pending.push_call(first).keys,
        "fair_due": limits.due_call(tenant, 1).keys,
        "rl_draw": limits.draw_call(ENDPOINT, tenant, run, 1, tokens=1, longest_ms=1).keys,
        "rl_adjust": limits.refund_call(ENDPOINT, tenant, 1).keys,
        "rl_adjust.block": limits.block_call(ENDPOINT, 1).keys,
        "fair_take": pending.take_call(tenant, queue, slot_extra_ms=1, aging_ms=1).keys,
        "rate": api_limits.rate_call("key-1", 123, "", limit=1, window_s=1).keys,
        "streams": api_limits.streams_call("key-1", "open", "s-1", lease_ms=1, cap=1).keys,
        "webhook_add": webhooks.add_call(tenant, WEBHOOK, 20, 0).keys,
        "webhook_queue": outbox.queue_call(tenant, DELIVERY, due_ms=0, retry=False).keys,
        "shop_read": list(shop_keys(tenant, "a-{shop}"))[:2],  # the tenant's slot, whatever
        "shop_write": list(shop_keys(tenant, "a-{shop}")),  # braces the shop's name has
        **{f"ledger.{op}": tenant_keys(tenant) for op in OPERATIONS},
    }  # fmt: skip


@pytest.mark.parametrize("queue", QUEUES)
@pytest.mark.parametrize("tenant", TENANTS)
def test_every_scripts_keys_hash_to_one_slot(tenant: str, queue: str) -> None:
    for script, script_keys in calls(tenant, queue).items():
        assert len(_slots(script_keys)) == 1, (script, script_keys)


def _script_names(store: RunStore) -> dict[str, str]:
    """The run store's registered scripts: each one's sha and the name of its file in lua/
    (a registered script is its libraries, then the file's text)."""
    files = {p.stem: p.read_text(encoding="utf-8") for p in Path(LUA).glob("*.lua")}
    scripts = [s for s in vars(store).values() if isinstance(s, Script)]
    return {
        s.sha: next(name for name, body in files.items() if name not in LIBRARIES
                    and str(s.script).endswith(body))
        for s in scripts
    }  # fmt: skip


def _offline_store() -> RunStore:
    """A run store over a client that never connects: registering a script does no I/O."""
    client = redis.Redis(port=1)
    return RunStore(client, Ledger(client), jobs=Registry(None))


def test_every_script_is_audited() -> None:
    """Each script in lua/ is the run store's (checked on what it sends) or listed in calls()."""
    scripts = {p.stem for p in Path(LUA).glob("*.lua")} - LIBRARIES
    sent = set(_script_names(_offline_store()).values())
    audited = sent | {n.partition(".")[0] for n in calls("t", "q") if not n.startswith("ledger.")}
    audited |= BROKER_ONLY
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
    tenants_own = keys.run(tenant, "r")
    assert len(_slots([tenants_own, *alone.keys])) > 1  # a single server's only
    assert len(_slots([tenants_own, *on_cluster.keys])) == 1


# A MONITOR line: its time, [db address], then each argument quoted (see _arguments).
_ARGUMENT = re.compile(r'"((?:[^"\\]|\\.)*)"')


def _arguments(line: str) -> list[str]:
    """A MONITOR line's command, its arguments unquoted (the server escapes \\, \" and
    bytes outside printable ASCII as \\xHH; Turnstile's keys are ASCII)."""
    return [
        codecs.decode(a.encode("ascii"), "unicode_escape")
        for a in _ARGUMENT.findall(line.partition("] ")[2])
    ]


@contextlib.contextmanager
def _script_calls(url: str, token: str) -> Iterator[list[list[str]]]:
    """Every EVALSHA the server runs while the block runs (MONITOR on a connection of its
    own, read in a thread until an ECHO of `token` comes by): each as its arguments."""
    seen: list[list[str]] = []
    watcher = redis.Redis.from_url(url, socket_timeout=30)
    monitor = watcher.monitor()  # type: ignore[no-untyped-call]
    monitor.__enter__()  # MONITOR is on when this returns

    def read() -> None:
        while True:
            line = str(monitor.connection.read_response())
            args = _arguments(line)
            if args[:2] == ["ECHO", token] or args[:2] == ["echo", token]:
                return
            if args and args[0].upper() == "EVALSHA":
                seen.append(args)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        yield seen
    finally:
        with redis.Redis.from_url(url) as other:
            other.echo(token)
        reader.join(timeout=30)
        monitor.__exit__()
        watcher.close()
    assert not reader.is_alive(), "the MONITOR reader never saw the end"


@pytest.mark.integration
def test_the_run_stores_script_calls_keep_their_keys_in_one_slot(
    redis_url: str, unique: str
) -> None:
    """Every script call a run store sends for a run's life, recorded off a real server: a run
    of a conversation created, a second one joining it to wait, the first loaded, its lease
    renewed, a hold taken, a field marked, a commit queueing its next step and claiming it as a
    worker on a cluster does, and the run failed (releasing the conversation to the waiting
    run); each call's KEYS hash to one slot, and every script the store registers was sent."""
    client = client_for(redis_url)
    store, tenant, queue = client.store, f"t-{unique}", f"nobody-{unique}"
    names = _script_names(store)
    with _script_calls(redis_url, f"done-{unique}") as sent:
        first = client.submit(tenant, USER, "support", GOAL, {}, queue=queue, conversation="c")
        client.submit(
            tenant, USER, "support", GOAL, {}, queue=queue, conversation="c",
            conversation_policy="enqueue",
        )  # fmt: skip
        loaded = store.load(
            tenant=tenant, run_id=first, version=1, queue=queue, inflight_lease_ms=15_000,
            delivery="d-1",
        )  # fmt: skip
        assert loaded.kind == "go", loaded
        assert store.renew(tenant=tenant, run_id=first, queue=queue, lease_ms=15_000)
        _, argv = store.ledger.reserve_script_args(tenant, f"{first}:x", {"tokens": 1},
                                                   timeout_s=60)  # fmt: skip
        assert store.hold(tenant, first, 1, argv) is not None
        marked = store.mark(tenant, first, version=1, status="running", fields={"probe": "1"},
                            event={"type": "probe"})  # fmt: skip
        assert marked.kind == "ok"
        following = StepMessage(tenant, first, 2, queue)
        committed = store.commit(
            Change(
                tenant=tenant, run_id=first, version=1, old_status="running", status="running",
                next_step=fair.pending_entry(following, 10.0, 12.0),
                claim=fair.claim(following, 12.0, CLUSTER, "d-2"), conversation="c",
            )
        )  # fmt: skip
        assert committed.kind == "ok", committed
        assert store.fail_run(tenant, first, "the probe ends it").kind == "ok"
    mine = [args for args in sent if args[1] in names and tenant in " ".join(args)]
    for args in mine:
        script_keys = args[3 : 3 + int(args[2])]
        assert len(_slots(script_keys)) == 1, (names[args[1]], script_keys)
    assert {names[args[1]] for args in mine} == set(names.values())
