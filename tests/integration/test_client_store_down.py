"""Every public method of the Python `Client` against a store that has stopped: a
`StoreUnavailableError` (a `TurnstileError`) naming the store by its URL with the password
hidden, never redis-py's own error, and nothing written: the store, started again with its
data, holds exactly what it held before the call."""

from __future__ import annotations

import inspect
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import redis

from tests.integration.workers import client_for, running_workers, wait_until
from turnstile.errors import StoreUnavailableError, TurnstileError
from turnstile.jobs.runs import new_run
from turnstile.jobs.support.scenarios import BY_LETTER, GOAL, USER
from turnstile.worker.client import Client, connect_client
from turnstile.worker.client._edge import GUARDED
from turnstile.worker.dev.embedded import EmbeddedServer
from turnstile.worker.settings import Settings
from turnstile.worker.store import keys

pytestmark = pytest.mark.integration

PASSWORD = "hunter2"  # noqa: S105 - in the client's URL only: the stopped server never sees it
SHORT_LIVED_MS = 600_000  # a worker's presence and capacity keys; a note here lives an hour


@dataclass
class Down:
    """A store with a suspended run (a held refund), a queued run and a note, which each test
    stops, calls one method against, and starts again with its data."""

    server: EmbeddedServer
    unique: str
    tenant: str
    held: str  # suspended, holding a refund for approval
    queued: str  # queued on a queue no worker reads
    last_event: str  # the held run's newest event id

    @property
    def url(self) -> str:
        return f"redis://:{PASSWORD}@127.0.0.1:{self.server.port}/0"

    def snapshot(self) -> dict[str, Any]:
        """Every key of this module's tenant and queues with what it holds (but the
        workers' short-lived ones, which expire on their own), and the run ids' owners."""
        raw = redis.Redis.from_url(self.server.url, decode_responses=True)
        try:
            found = {
                key: _content(raw, key)
                for key in raw.scan_iter(f"*{self.unique}*", count=1000)
                if not 0 <= raw.pttl(key) < SHORT_LIVED_MS
            }
            owners = {k: v for k, v in raw.hgetall(keys.RUN_TENANTS).items()
                      if self.unique in v}  # fmt: skip
        finally:
            raw.close()
        return {"keys": found, "owners": owners}


def _content(raw: redis.Redis, key: str) -> object:
    """What a key holds, whatever its encoding (a restart may re-encode it)."""
    kind = str(raw.type(key))
    read: dict[str, Callable[[], object]] = {
        "string": lambda: raw.get(key),
        "hash": lambda: raw.hgetall(key),
        "list": lambda: raw.lrange(key, 0, -1),
        "set": lambda: sorted(raw.smembers(key)),
        "zset": lambda: raw.zrange(key, 0, -1, withscores=True),
        "stream": lambda: raw.xrange(key),
    }
    return kind, read.get(kind, lambda: None)()


@pytest.fixture(scope="module")
def down() -> Iterator[Down]:
    unique = f"down{uuid.uuid4().hex[:10]}"
    tenant, queue = f"t-{unique}", f"q-{unique}"
    with EmbeddedServer(appendonly=True) as server:
        client = connect_client(Settings(redis_url=server.url, allow_drills=True))
        try:
            with running_workers(server.url, [queue], 1):
                held = client.submit(tenant, USER, "support", GOAL, BY_LETTER["G"].params,
                                     queue=queue)  # fmt: skip
                wait_until(lambda: client.state(held).status.value == "suspended",
                           what="the refund is held for approval", timeout_s=90)  # fmt: skip
            queued = client.submit(tenant, USER, "support", GOAL, queue=f"idle-{unique}")
            client.remember(tenant, USER, "prefers email", source="user_message", ttl_s=3600)
            last = list(client.events(held, timeout_s=0.1))[-1].id
        finally:
            client.close()
        yield Down(server, unique, tenant, held, queued, last)


def _calls(t: str, unique: str, held: str, queued: str) -> dict[str, Callable[[Client], object]]:
    """One call of each public method, with arguments it would act on were the store up: a
    new run, the held run's approval or denial, the queued run's cancel, a note."""
    new = f"run_new_{unique}"
    return {
        "submit": lambda c: c.submit(t, USER, "support", GOAL, run_id=new),
        "submit_state": lambda c: c.submit_state(
            new_run(
                run_id=new,
                tenant=t,
                user_id=USER,
                job=c.jobs.get("support"),
                goal=GOAL,
            )
        ),  # a fork's way in (worker/ops/fork.py)
        "submit_run": lambda c: c.submit_run(t, USER, "support", GOAL, idempotency_key="k1"),
        "submit_run conversation": lambda c: c.submit_run(
            t, USER, "support", GOAL, conversation=f"conv-{unique}", run_id=new
        ),
        "tenant_of": lambda c: c.tenant_of(held),
        "run_hash": lambda c: c.run_hash(held),
        "state": lambda c: c.state(held, tenant=t),
        "wait": lambda c: c.wait(held, 5),
        "events": lambda c: list(c.events(held)),
        "approve": lambda c: c.approve(held, by="ana"),
        "deny": lambda c: c.deny(held, by="ana", reason="no"),
        "cancel": lambda c: c.cancel(queued, by="ana"),
        "remember": lambda c: c.remember(t, USER, "call me", source="user_message", ttl_s=3600),
        "recall": lambda c: c.recall(t, USER, "email"),
        "forget": lambda c: c.forget(t, user=USER),
        "notes": lambda c: c.notes(t),
    }


CALLS = list(_calls("t", "x", "run_x", "run_y"))
PUBLIC = sorted(
    name for name, member in inspect.getmembers(Client, inspect.isfunction)
    if not name.startswith("_") and name != "close"
)  # fmt: skip


def test_every_public_method_is_guarded_and_called_here() -> None:
    """Each public method of Client goes through the store edge, and this module calls each
    (a method added later is a case here, or this fails)."""
    assert all(getattr(getattr(Client, name), GUARDED, False) for name in [*PUBLIC, "close"])
    assert {name.split()[0] for name in CALLS} == set(PUBLIC)


def _refused(d: Down, call: Callable[[Client], object]) -> StoreUnavailableError:
    """The call against the stopped store; what it raised."""
    client = client_for(d.url, redis_timeout_s=2.0)
    with pytest.raises(StoreUnavailableError) as caught:
        call(client)
    return caught.value


def _says_the_store(d: Down, error: StoreUnavailableError) -> None:
    line = str(error)
    assert isinstance(error, TurnstileError) and not isinstance(error, redis.RedisError)
    assert f"store unreachable at redis://:***@127.0.0.1:{d.server.port}/0: " in line, line
    assert PASSWORD not in line and "\n" not in line


@pytest.mark.parametrize("method", CALLS)
def test_a_stopped_store_is_store_unavailable_naming_it_and_nothing_is_written(
    down: Down, method: str
) -> None:
    """The method raises StoreUnavailableError with the store's URL, its password hidden;
    started again, the store holds what it held before."""
    before = down.snapshot()
    down.server.stop()
    try:
        error = _refused(down, _calls(down.tenant, down.unique, down.held, down.queued)[method])
    finally:
        down.server.start()
    _says_the_store(down, error)
    assert down.snapshot() == before


def test_following_events_when_the_store_stops_is_store_unavailable(down: Down) -> None:
    """`events` looked the run up while the store answered; the store stopping under the
    iteration is a StoreUnavailableError from the iteration, naming the store."""
    client = client_for(down.url.replace(f":{PASSWORD}@", ""), redis_timeout_s=2.0)
    following = client.events(down.held, after=down.last_event)
    down.server.stop()
    try:
        with pytest.raises(StoreUnavailableError) as caught:
            next(following)
    finally:
        down.server.start()
    line = str(caught.value)
    assert f"store unreachable at redis://127.0.0.1:{down.server.port}/0: " in line, line
