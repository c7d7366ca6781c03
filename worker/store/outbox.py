"""The webhook outbox: each endpoint's deliveries waiting to be sent, in its own keys in the
tenant's slot (`http_keys.py` `outbox`, `deliveries`, `born`), and what the deliverer does
with them: queue one (`webhook_queue.lua`, which writes only for an endpoint still
registered), read the due ones, take one out, find the ones past their retry time.

An endpoint's deliveries are apart from every other endpoint's, so the deliverer can take a
few of each tenant's in turn, and leave an endpoint whose breaker is open alone, without
reading past anyone's backlog. Older servers kept one shared outbox for every endpoint; what
they left there is moved into the endpoints' own (`adopt_legacy`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Any

import msgspec
import redis
import structlog

from turnstile.worker.store import http_keys as keys
from turnstile.worker.store.scripts import ScriptCall, evalsha, register, with_scripts
from turnstile.worker.store.values import one_line
from turnstile.worker.store.webhooks import WEBHOOKS, endpoint_tenant

log = structlog.get_logger("turnstile.webhooks")

LEGACY_PER_TICK = 200  # deliveries moved from the shared outbox each tick


class Delivery(msgspec.Struct):
    id: str
    endpoint: str
    event: str
    body: str
    first_ms: int
    attempts: int = 0


def delivery_id(endpoint_id: str, run_id: str, entry_id: str) -> str:
    return "dlv_" + hashlib.sha256(f"{endpoint_id}|{run_id}|{entry_id}".encode()).hexdigest()[:24]


def decode(raw: Any, did: str) -> Delivery | None:
    """The stored delivery, or None when it is gone or unreadable (logged: it is dropped)."""
    if raw is None:
        return None
    try:
        return msgspec.json.decode(raw, type=Delivery)
    except msgspec.DecodeError as exc:
        log.warning("webhook_delivery_unreadable", delivery=did, error=one_line(str(exc)))
        return None


class Writes:
    """Commands gathered now and put into a pipeline later, as `with_scripts` builds it (and
    builds again, when the server had lost a script). Any pipeline method is recorded."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    def __getattr__(self, name: str) -> Callable[..., None]:
        return lambda *args, **kwargs: self.calls.append((name, args, kwargs))

    def build(self, pipe: Any) -> None:
        for name, args, kwargs in self.calls:
            getattr(pipe, name)(*args, **kwargs)


def queue_call(tenant: str, delivery: Delivery, *, due_ms: int, retry: bool) -> ScriptCall:
    """webhook_queue.lua: `delivery` into its endpoint's outbox, due at `due_ms`."""
    return ScriptCall(
        [keys.tenant_webhooks(tenant), *keys.endpoint_queue(tenant, delivery.endpoint)],
        [delivery.endpoint, delivery.id, msgspec.json.encode(delivery), due_ms,
         delivery.first_ms, "retry" if retry else "new"],
    )  # fmt: skip


class Outbox:
    def __init__(self, r: redis.Redis) -> None:
        self.r = r
        self.queue = register(r, "webhook_queue")

    def add(
        self, pipe: Any, tenant: str, delivery: Delivery, *, due_ms: int, retry: bool = False
    ) -> None:
        """Queue `delivery` in the pipeline (or `Writes`) `pipe`: new, or again after a try."""
        call = queue_call(tenant, delivery, due_ms=due_ms, retry=retry)
        evalsha(pipe, self.queue, call.keys, call.args)

    def write(self, build: Callable[[Any], None]) -> None:
        """Run the pipeline `build` fills, which may call `add`."""
        with_scripts(self.r, [self.queue], build)

    def retry(self, tenant: str, delivery: Delivery, *, due_ms: int) -> None:
        self.write(lambda pipe: self.add(pipe, tenant, delivery, due_ms=due_ms, retry=True))

    def due(self, wanted: Sequence[tuple[str, str, int]], now_ms: int) -> list[list[str]]:
        """For each (tenant, endpoint id, at most), the ids of its deliveries due by now, the
        longest due first."""
        if not wanted:
            return []
        pipe = self.r.pipeline(transaction=False)
        for tenant, endpoint_id, most in wanted:
            pipe.zrangebyscore(keys.outbox(tenant, endpoint_id), "-inf", now_ms, start=0,
                               num=most)  # fmt: skip
        return [[str(d) for d in ids] for ids in pipe.execute()]

    def lease(self, tenant: str, endpoint_id: str, did: str, *, until_ms: int) -> None:
        """Push the delivery back for the attempt's length: if this process dies in the middle,
        the next deliverer tries it again after that."""
        self.r.zadd(keys.outbox(tenant, endpoint_id), {did: until_ms}, xx=True)

    def read(self, tenant: str, endpoint_id: str, did: str) -> Any:
        return self.r.hget(keys.deliveries(tenant, endpoint_id), did)

    def forget(self, tenant: str, endpoint_id: str, did: str) -> None:
        outbox, deliveries, born = keys.endpoint_queue(tenant, endpoint_id)
        pipe = self.r.pipeline(transaction=False)
        pipe.zrem(outbox, did)
        pipe.hdel(deliveries, did)
        pipe.zrem(born, did)
        pipe.execute()

    def expired(
        self, held: Sequence[tuple[str, str]], *, taken_before_ms: int, most: int
    ) -> list[tuple[str, str, str, Delivery | None]]:
        """For each (tenant, endpoint id), its deliveries whose event was taken before
        `taken_before_ms`, oldest first, at most `most` each: (tenant, endpoint id, delivery
        id, its record, None when it is gone or unreadable)."""
        if not held:
            return []
        pipe = self.r.pipeline(transaction=False)
        for tenant, endpoint_id in held:
            pipe.zrangebyscore(keys.born(tenant, endpoint_id), "-inf", f"({taken_before_ms}",
                               start=0, num=most)  # fmt: skip
        found = [(t, e, [str(d) for d in ids])
                 for (t, e), ids in zip(held, pipe.execute(), strict=True) if ids]  # fmt: skip
        if not found:
            return []
        pipe = self.r.pipeline(transaction=False)
        for tenant, endpoint_id, ids in found:
            pipe.hmget(keys.deliveries(tenant, endpoint_id), ids)
        return [(tenant, endpoint_id, did, decode(raw, did))
                for (tenant, endpoint_id, ids), records in zip(found, pipe.execute(), strict=True)
                for did, raw in zip(ids, records, strict=True)]  # fmt: skip

    def adopt_legacy(self) -> int:
        """Move deliveries an older server left in the shared outbox into their endpoints'
        own, each as due as it was; one whose endpoint is gone is dropped, as that server
        would have. The number moved."""
        found: list[Any] = self.r.zrange(keys.LEGACY_OUTBOX, 0, LEGACY_PER_TICK - 1,
                                         withscores=True)  # fmt: skip
        if not found:
            return 0
        ids = [str(did) for did, _ in found]
        records = self.r.hmget(keys.LEGACY_DELIVERIES, ids)
        moving = [(d, int(due)) for (did, due), raw in zip(found, records, strict=True)
                  if (d := decode(raw, str(did))) is not None]  # fmt: skip
        owners = self.r.hmget(WEBHOOKS, [d.endpoint for d, _ in moving]) if moving else []
        writes = Writes()
        moved = 0
        for (delivery, due_ms), owner in zip(moving, owners, strict=True):
            if (tenant := endpoint_tenant(owner)) is not None:
                self.add(writes, tenant, delivery, due_ms=due_ms)
                moved += 1
        writes.zrem(keys.LEGACY_OUTBOX, *ids)
        writes.hdel(keys.LEGACY_DELIVERIES, *ids)
        self.write(writes.build)
        log.info("webhook_legacy_outbox_moved", moved=moved, dropped=len(ids) - moved)
        return moved
