"""The webhook deliverer: learns of run events by reading what every commit already writes,
and delivers them signed, with retries, never in a turn's way.

How it learns (per tenant with endpoints, each tick):
  1. runs created since its cursor (the tenant's `runs` index, by creation ms) join its watch;
  2. each watched run's event stream is read from where it last stopped (XRANGE, exclusive);
     a `suspended` entry becomes `run.needs_approval`, a `finished` one `run.finished` and
     ends the watch. The work per tick follows the runs in progress, not every run ever made.

How it delivers: each delivery (one per endpoint and event, with a deterministic id) waits in
its endpoint's outbox (`worker.store.outbox`) sorted by when it is due. Due deliveries go out
on a pool of threads, so a slow endpoint holds one thread for at most its timeout; a failure
is retried with exponential backoff until `webhook_retry_for_s` has passed since the event,
then dropped, and the endpoint's last status records each attempt.

Fair between tenants: a tenant has at most `webhook_tenant_concurrency` deliveries in flight,
and each tick the tenants, and each tenant's endpoints, take their turns in rotation, so
endpoints that never answer hold that tenant's slots and no one else's. An endpoint that
keeps failing is backed off by its breaker (`worker.http.breaker`: open after
`webhook_breaker_failures` failures in a row, one trial after `webhook_breaker_cooldown_s`);
its deliveries wait meanwhile and the ones past their retry time are given up, recorded as
a failed attempt's would be. The breakers live in the deliverer: another server that takes
the lease starts with them closed. Each attempt checks the target again
(`worker.http.targets`) and connects to the address it checked; a refused target, a redirect
or any error in sending is a failed attempt like a 500. Delivery is at least once: a receiver
dedupes by the `Turnstile-Delivery` id. One deliverer runs at a time, holding a lease in the
store, so several API servers behind a load balancer do not each deliver.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import httpx
import msgspec
import redis
import structlog

from turnstile.backoff import backoff_s
from turnstile.worker.http.breaker import Breaker, Circuit
from turnstile.worker.http.routes_webhooks import (
    FROM_STREAM,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    sign,
    target_checker,
)
from turnstile.worker.http.settings import ApiSettings
from turnstile.worker.http.targets import TargetError
from turnstile.worker.store import locks
from turnstile.worker.store import webhooks as stored
from turnstile.worker.store.outbox import Delivery, Outbox, Writes, decode, delivery_id
from turnstile.worker.store.values import one_line, server_ms
from turnstile.worker.store.webhooks import Endpoint

log = structlog.get_logger("turnstile.webhooks")

NEW_RUNS_PER_TICK = 1000
EVENTS_PER_READ = 100
DUE_PER_TICK = 200


def payload(kind: str, tenant: str, run_id: str, entry_id: str, event: dict[str, Any]) -> str:
    return msgspec.json.encode(
        {
            "type": kind,
            "tenant": tenant,
            "run_id": run_id,
            "event_id": entry_id,
            "at": event.get("at", ""),
            "event": event,
        }
    ).decode()


def _turned(items: list[str], turn: int) -> list[str]:
    """`items` rotated by `turn`: who goes first changes every tick."""
    if not items:
        return items
    at = turn % len(items)
    return items[at:] + items[:at]


class Scanner:
    """Turns new `suspended` and `finished` stream entries into deliveries in the outbox."""

    def __init__(self, r: redis.Redis) -> None:
        self.r = r
        self.outbox = Outbox(r)

    def tick(self) -> int:
        made = 0
        for tenant in stored.tenants(self.r):
            found = stored.endpoints(self.r, tenant)
            if found:
                stored.watch_new_runs(self.r, tenant, NEW_RUNS_PER_TICK)
                made += self._read_streams(tenant, found)
        return made

    def _read_streams(self, tenant: str, found: list[Endpoint]) -> int:
        watched = stored.watched(self.r, tenant)
        if not watched:
            return 0
        ids = sorted(watched)
        unread = stored.unread(self.r, tenant, {r: watched[r] for r in ids}, EVENTS_PER_READ)
        now = server_ms(self.r)
        write = Writes()
        made = 0
        for run_id, entries in zip(ids, unread, strict=True):
            made += self._run_entries(write, tenant, run_id, entries=entries, found=found, now=now)
        if write.calls:
            self.outbox.write(write.build)
        return made

    def _run_entries(
        self, write: Writes, tenant: str, run_id: str, *, entries: list[tuple[str, str]],
        found: list[Endpoint], now: int,
    ) -> int:  # fmt: skip
        made = 0
        for entry_id, data in entries:
            event: dict[str, Any] = msgspec.json.decode(data)
            kind = FROM_STREAM.get(str(event.get("type")))
            if kind is not None:
                body = payload(kind.value, tenant, run_id, entry_id, event)
                for endpoint in found:
                    if kind.value in endpoint.events:
                        made += 1
                        self._enqueue(write, endpoint, kind.value, body=body, run_id=run_id,
                                      entry_id=entry_id, now=now)  # fmt: skip
            if kind is FROM_STREAM["finished"]:
                stored.finished(write, tenant, run_id, stored.created_ms(self.r, tenant, run_id))
                return made
        if entries:
            stored.read_to(write, tenant, run_id, entries[-1][0])
        return made

    def _enqueue(
        self, write: Writes, endpoint: Endpoint, kind: str, *, body: str, run_id: str,
        entry_id: str, now: int,
    ) -> None:  # fmt: skip
        did = delivery_id(endpoint.id, run_id, entry_id)
        self.outbox.add(write, endpoint.tenant, Delivery(did, endpoint.id, kind, body, now),
                        due_ms=now)  # fmt: skip


class Sender:
    """Starts due deliveries on a thread pool, a fair part for each tenant, none for an
    endpoint whose breaker is open, and records how each attempt went."""

    def __init__(self, r: redis.Redis, settings: ApiSettings) -> None:
        self.r, self.settings = r, settings
        self.outbox = Outbox(r)
        self.pool = ThreadPoolExecutor(settings.webhook_concurrency, "webhook")
        self.inflight: dict[str, str] = {}  # delivery id -> its tenant
        self.breakers: dict[str, Breaker] = {}  # endpoint id -> its breaker
        self.lock = threading.Lock()
        self.local = threading.local()
        self.targets = target_checker(settings)
        self.turn = 0  # who goes first this tick: each tenant, and each endpoint, in turn

    def tick(self) -> None:
        now = server_ms(self.r)
        self.outbox.adopt_legacy()
        owned = self._endpoints()
        self._give_up_expired(owned, now)
        wanted = self._wanted(owned, now)
        found = self.outbox.due(wanted, now)
        for tenant, endpoint_id, did in self._choose(wanted, found):
            self._start(tenant, endpoint_id, did, now)

    def _endpoints(self) -> dict[str, list[str]]:
        """Each tenant's endpoint ids, tenants and endpoints in this tick's turn."""
        tenants = _turned(stored.tenants(self.r), self.turn)
        self.turn += 1
        ids_of = stored.endpoint_ids(self.r, tenants)
        owned = {t: _turned(sorted(ids), self.turn)
                 for t, ids in zip(tenants, ids_of, strict=True)}  # fmt: skip
        registered = {i for ids in owned.values() for i in ids}
        with self.lock:  # the breakers of removed endpoints go with them
            for gone in set(self.breakers) - registered:
                del self.breakers[gone]
        return owned

    def _room(self, tenant: str) -> int:
        """Deliveries the tenant may start now: its own slots left, within the pool's."""
        busy = list(self.inflight.values())
        pool_left = self.settings.webhook_concurrency - len(busy)
        return min(pool_left, self.settings.webhook_tenant_concurrency - busy.count(tenant))

    def _wanted(self, owned: dict[str, list[str]], now: int) -> list[tuple[str, str, int]]:
        """(tenant, endpoint, at most) for every endpoint that may start deliveries now."""
        wanted = []
        with self.lock:
            for tenant, endpoint_ids in owned.items():
                room = self._room(tenant)
                for endpoint_id in endpoint_ids if room > 0 else []:
                    allowed = self._breaker(endpoint_id).allowed(now)
                    if allowed != 0:
                        wanted.append((tenant, endpoint_id, room if allowed is None else 1))
        return wanted

    def _choose(
        self, wanted: list[tuple[str, str, int]], found: list[list[str]]
    ) -> list[tuple[str, str, str]]:
        """What to start: each tenant's due deliveries taken from its endpoints in turn, up to
        the tenant's room, tenants in turn up to the pool's."""
        by_tenant: dict[str, list[list[tuple[str, str, str]]]] = {}
        with self.lock:
            for (tenant, endpoint_id, _), ids in zip(wanted, found, strict=True):
                by_tenant.setdefault(tenant, []).append(
                    [(tenant, endpoint_id, did) for did in ids if did not in self.inflight]
                )
            pool_left = self.settings.webhook_concurrency - len(self.inflight)
            chosen: list[tuple[str, str, str]] = []
            for tenant, lists in by_tenant.items():
                turns = [x for row in itertools.zip_longest(*lists) for x in row if x is not None]
                chosen += turns[: max(0, min(self._room(tenant), pool_left - len(chosen)))]
        return chosen

    def _start(self, tenant: str, endpoint_id: str, did: str, now: int) -> None:
        with self.lock:
            self.inflight[did] = tenant
            trial = self._breaker(endpoint_id).started(now)
        lease_ms = int((self.settings.webhook_timeout_s + 5) * 1000)
        self.outbox.lease(tenant, endpoint_id, did, until_ms=now + lease_ms)
        self.pool.submit(self._attempt, tenant, endpoint_id, did, trial)

    def _breaker(self, endpoint_id: str) -> Breaker:
        """The endpoint's breaker (called under the lock)."""
        found = self.breakers.get(endpoint_id)
        if found is None:
            found = self.breakers[endpoint_id] = Breaker(
                self.settings.webhook_breaker_failures,
                int(self.settings.webhook_breaker_cooldown_s * 1000),
            )
        return found

    def _give_up_expired(self, owned: dict[str, list[str]], now: int) -> None:
        """Deliveries held back by an open breaker past their retry time end as a failed
        attempt would: given up, recorded, dropped."""
        retry_ms = int(self.settings.webhook_retry_for_s * 1000)
        with self.lock:
            held = [(t, e) for t, ids in owned.items() for e in ids
                    if self._breaker(e).state(now) is not Circuit.CLOSED]  # fmt: skip
        expired = self.outbox.expired(held, taken_before_ms=now - retry_ms, most=DUE_PER_TICK)
        for tenant, endpoint_id, did, delivery in expired:
            if did in self.inflight:
                continue
            if delivery is not None:
                self._held_back(tenant, endpoint_id, delivery, now)
            self.outbox.forget(tenant, endpoint_id, did)

    def _held_back(self, tenant: str, endpoint_id: str, delivery: Delivery, now: int) -> None:
        with self.lock:
            failures = self._breaker(endpoint_id).failures
        status = {
            "delivery": delivery.id, "type": delivery.event, "status_code": 0,
            "error": f"not sent: the endpoint's breaker is open (failed attempts in a row: "
                     f"{failures})", "attempts": delivery.attempts, "at_ms": now,
            "result": "gave_up", "circuit": Circuit.OPEN.value, "consecutive_failures": failures,
        }  # fmt: skip
        stored.record_status(self.r, endpoint_id, status)
        log.info("webhook_attempt", endpoint=endpoint_id, tenant=tenant, **status)

    def _client(self) -> httpx.Client:
        client = getattr(self.local, "client", None)
        if client is None:
            # No kept-alive connections: a pooled connection is keyed by address, so one
            # verified for another host name on the same address could otherwise be reused.
            client = httpx.Client(
                timeout=self.settings.webhook_timeout_s, follow_redirects=False,
                limits=httpx.Limits(max_keepalive_connections=0),
            )  # fmt: skip
            self.local.client = client
        return client

    def _attempt(self, tenant: str, endpoint_id: str, did: str, trial: bool) -> None:
        settled = False
        try:
            settled = self._deliver(tenant, endpoint_id, did, trial)
        except redis.RedisError as exc:
            log.warning("webhook_store_error", delivery=did, error=one_line(str(exc)))
        except Exception:  # a bug here must show in the log, not vanish with the future
            log.exception("webhook_attempt_failed", delivery=did)
        finally:
            with self.lock:
                self.inflight.pop(did, None)
                if trial and not settled:  # no attempt was made: the next may be the trial
                    self._breaker(endpoint_id).abandoned()

    def _load(self, tenant: str, endpoint_id: str, did: str) -> tuple[Delivery, Endpoint] | None:
        """The delivery and its endpoint; None (and the delivery dropped) when either is gone
        or unreadable."""
        delivery = decode(self.outbox.read(tenant, endpoint_id, did), did)
        endpoint_raw = stored.endpoint(self.r, endpoint_id) if delivery else None
        try:
            if delivery is not None and endpoint_raw is not None:
                return delivery, msgspec.json.decode(endpoint_raw, type=Endpoint)
        except msgspec.DecodeError as exc:  # nothing to count attempts on: dropped, once
            log.warning("webhook_endpoint_unreadable", endpoint=endpoint_id,
                        error=one_line(str(exc)))  # fmt: skip
        self.outbox.forget(tenant, endpoint_id, did)
        return None

    def _deliver(self, tenant: str, endpoint_id: str, did: str, trial: bool) -> bool:
        """One attempt; whether it was made (and told the endpoint's breaker)."""
        loaded = self._load(tenant, endpoint_id, did)
        if loaded is None:  # delivered already, or the endpoint is gone
            return False
        delivery, endpoint = loaded
        code, error = self._post(endpoint, delivery)
        delivery.attempts += 1
        now = server_ms(self.r)
        ok = 200 <= code < 300
        circuit, failures = self._settle(endpoint, ok=ok, now=now, trial=trial)
        gave_up = not ok and now - delivery.first_ms >= self.settings.webhook_retry_for_s * 1000
        result = "delivered" if ok else "gave_up" if gave_up else "retrying"
        self._record(endpoint, delivery, code=code, error=error, now=now, result=result,
                     circuit=circuit, failures=failures)  # fmt: skip
        if ok or gave_up:
            self.outbox.forget(tenant, endpoint_id, did)
            return True
        wait_s = backoff_s(delivery.attempts, base_s=self.settings.webhook_backoff_base_s,
                           max_s=self.settings.webhook_backoff_max_s)  # fmt: skip
        self.outbox.retry(tenant, delivery, due_ms=now + int(wait_s * 1000))
        return True

    def _settle(
        self, endpoint: Endpoint, *, ok: bool, now: int, trial: bool
    ) -> tuple[Circuit, int]:
        """Tell the endpoint's breaker how an attempt went; its state after, and its failures
        in a row."""
        with self.lock:
            breaker = self._breaker(endpoint.id)
            before = breaker.state(now)
            after = breaker.finished(ok=ok, now_ms=now, trial=trial)
            failures = breaker.failures
        if after is not before and after is not Circuit.HALF_OPEN:
            log.info("webhook_circuit_" + ("opened" if after is Circuit.OPEN else "closed"),
                     endpoint=endpoint.id, tenant=endpoint.tenant, failures=failures,
                     cooldown_s=self.settings.webhook_breaker_cooldown_s)  # fmt: skip
        return after, failures

    def _post(self, endpoint: Endpoint, delivery: Delivery) -> tuple[int, str]:
        body = delivery.body.encode()
        timestamp = str(int(time.time()))
        headers = {
            "Content-Type": "application/json", "User-Agent": "turnstile-webhooks/1",
            TIMESTAMP_HEADER: timestamp, SIGNATURE_HEADER: sign(endpoint.secret, timestamp, body),
            "Turnstile-Event": delivery.event, "Turnstile-Delivery": delivery.id,
        }  # fmt: skip
        try:
            # Checked again now: the name may resolve elsewhere than at registration, and the
            # request goes to the address checked here, whatever DNS answers next.
            target = self.targets.check(endpoint.url)
        except TargetError as exc:  # never sent
            log.warning("webhook_target_refused", endpoint=endpoint.id, tenant=endpoint.tenant,
                        code=exc.code, reason=exc.reason, address=exc.address)  # fmt: skip
            return 0, f"{exc.code}: {exc.reason}"
        try:
            reply = self._client().send(target.request(body, headers), stream=True)
            reply.close()  # the status is all a delivery needs; the body is never read
        except Exception as exc:  # counted as a failed attempt, whatever it was
            return 0, one_line(f"{type(exc).__name__}: {exc}", 200)
        if 300 <= reply.status_code < 400:
            return reply.status_code, "redirects are not followed"
        return reply.status_code, ""

    def _record(
        self, endpoint: Endpoint, delivery: Delivery, *, code: int, error: str, now: int,
        result: str, circuit: Circuit, failures: int,
    ) -> None:  # fmt: skip
        status = {
            "delivery": delivery.id, "type": delivery.event, "status_code": code,
            "error": error, "attempts": delivery.attempts, "at_ms": now, "result": result,
            "circuit": circuit.value, "consecutive_failures": failures,
        }  # fmt: skip
        stored.record_status(self.r, endpoint.id, status)
        log.info("webhook_attempt", endpoint=endpoint.id, tenant=endpoint.tenant, **status)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


class WebhookDeliverer(threading.Thread):
    """One thread: hold the lease, scan, send what is due, every tick."""

    def __init__(self, r: redis.Redis, settings: ApiSettings) -> None:
        super().__init__(name="webhook-deliverer", daemon=True)
        self.r, self.settings = r, settings
        self.owner = uuid.uuid4().hex
        self.stopping = threading.Event()
        self.scanner = Scanner(r)
        self.sender = Sender(r, settings)

    def _lead(self) -> bool:
        lease_ms = int(max(self.settings.webhook_tick_s * 6, 3) * 1000)
        return locks.lead(self.r, locks.DELIVERER, self.owner, lease_ms)

    def run(self) -> None:
        failing = False
        while not self.stopping.is_set():
            try:
                if self._lead():
                    self.scanner.tick()
                    self.sender.tick()
                if failing:
                    log.info("webhook_dispatch_recovered")
                failing = False
            except (redis.RedisError, msgspec.DecodeError) as exc:
                if not failing:  # once per outage, not every tick
                    log.warning("webhook_dispatch_error", error=one_line(str(exc)))
                failing = True
            self.stopping.wait(self.settings.webhook_tick_s)

    def stop(self) -> None:
        self.stopping.set()
        self.join(timeout=self.settings.webhook_tick_s + 5)
        self.sender.close()
        locks.resign(self.r, locks.DELIVERER, self.owner)


@contextmanager
def background(r: redis.Redis, settings: ApiSettings) -> Iterator[WebhookDeliverer | None]:
    """The deliverer, running for as long as the server does (when webhooks are on)."""
    if not settings.webhooks:
        yield None
        return
    deliverer = WebhookDeliverer(r, settings)
    deliverer.start()
    try:
        yield deliverer
    finally:
        with contextlib.suppress(redis.RedisError):  # the store is gone: the lease lapses
            deliverer.stop()
