"""The webhook deliverer: learns of run events by reading what every commit already writes,
and delivers them signed, with retries, never in a turn's way.

How it learns (per tenant with endpoints, each tick):
  1. runs created since its cursor (the tenant's `runs` index, by creation ms) join its watch;
  2. each watched run's event stream is read from where it last stopped (XRANGE, exclusive);
     a `suspended` entry becomes `run.needs_approval`, a `finished` one `run.finished` and
     ends the watch. The work per tick follows the runs in progress, not every run ever made.

How it delivers: each delivery (one per endpoint and event, with a deterministic id) waits in
an outbox sorted by when it is due. Due deliveries go out on a pool of threads, so a slow
endpoint holds one thread for at most its timeout; a failure is retried with exponential
backoff until `webhook_retry_for_s` has passed since the event, then dropped, and the
endpoint's last status records each attempt. Each attempt checks the target again
(`worker.http.targets`) and connects to the address it checked; a refused target, a redirect
or any error in sending is a failed attempt like a 500. Delivery is at least once: a receiver
dedupes by the `Turnstile-Delivery` id. One deliverer runs at a time, holding a lease in the
store, so several API servers behind a load balancer do not each deliver.
"""

from __future__ import annotations

import contextlib
import hashlib
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
from turnstile.worker.http import keys
from turnstile.worker.http.problems import one_line
from turnstile.worker.http.routes_webhooks import (
    FROM_STREAM,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    Endpoint,
    sign,
    target_checker,
)
from turnstile.worker.http.routes_webhooks import endpoints as tenant_endpoints
from turnstile.worker.http.settings import ApiSettings
from turnstile.worker.http.targets import TargetError
from turnstile.worker.store import keys as run_keys
from turnstile.worker.store.values import server_ms

log = structlog.get_logger("turnstile.webhooks")

NEW_RUNS_PER_TICK = 1000
EVENTS_PER_READ = 100
DUE_PER_TICK = 200


class Delivery(msgspec.Struct):
    id: str
    endpoint: str
    event: str
    body: str
    first_ms: int
    attempts: int = 0


def delivery_id(endpoint_id: str, run_id: str, entry_id: str) -> str:
    return "dlv_" + hashlib.sha256(f"{endpoint_id}|{run_id}|{entry_id}".encode()).hexdigest()[:24]


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


class Scanner:
    """Turns new `suspended` and `finished` stream entries into deliveries in the outbox."""

    def __init__(self, r: redis.Redis) -> None:
        self.r = r

    def tick(self) -> int:
        made = 0
        for tenant in sorted(str(t) for t in self.r.smembers(keys.WEBHOOK_TENANTS)):
            found = tenant_endpoints(self.r, tenant)
            if found:
                self._watch_new_runs(tenant)
                made += self._read_streams(tenant, found)
        return made

    def _watch_new_runs(self, tenant: str) -> None:
        cursor = int(self.r.get(keys.cursor(tenant)) or server_ms(self.r))
        new: list[Any] = self.r.zrangebyscore(
            run_keys.runs(tenant), cursor, "+inf", start=0, num=NEW_RUNS_PER_TICK,
            withscores=True,
        )  # fmt: skip
        if not new:
            return
        pipe = self.r.pipeline(transaction=False)
        for run_id, _ in new:
            pipe.zscore(keys.done(tenant), run_id)
        finished_before = pipe.execute()
        top = max(int(score) for _, score in new)
        pipe = self.r.pipeline(transaction=False)
        for (run_id, _), done in zip(new, finished_before, strict=True):
            if done is None:
                pipe.hsetnx(keys.watch(tenant), run_id, "-")
        pipe.set(keys.cursor(tenant), top)
        pipe.zremrangebyscore(keys.done(tenant), "-inf", f"({top}")
        pipe.execute()

    def _read_streams(self, tenant: str, found: list[Endpoint]) -> int:
        watched = {str(k): str(v) for k, v in self.r.hgetall(keys.watch(tenant)).items()}
        if not watched:
            return 0
        ids = sorted(watched)
        pipe = self.r.pipeline(transaction=False)
        for run_id in ids:
            last = watched[run_id]
            start = "-" if last == "-" else f"({last}"
            pipe.xrange(run_keys.events(tenant, run_id), min=start, count=EVENTS_PER_READ)
        now = server_ms(self.r)
        write = self.r.pipeline(transaction=False)
        made = 0
        for run_id, entries in zip(ids, pipe.execute(), strict=True):
            made += self._run_entries(write, tenant, run_id, entries=entries, found=found, now=now)
        write.execute()
        return made

    def _run_entries(
        self, write: Any, tenant: str, run_id: str, *, entries: list[Any],
        found: list[Endpoint], now: int,
    ) -> int:  # fmt: skip
        made = 0
        for entry_id, fields in entries:
            event: dict[str, Any] = msgspec.json.decode(str(fields.get("event", "{}")))
            kind = FROM_STREAM.get(str(event.get("type")))
            if kind is not None:
                body = payload(kind.value, tenant, run_id, str(entry_id), event)
                for endpoint in found:
                    if kind.value in endpoint.events:
                        made += 1
                        self._enqueue(write, endpoint, kind.value, body=body, run_id=run_id,
                                      entry_id=str(entry_id), now=now)  # fmt: skip
            if kind is FROM_STREAM["finished"]:
                write.hdel(keys.watch(tenant), run_id)
                score = self.r.zscore(run_keys.runs(tenant), run_id) or 0
                write.zadd(keys.done(tenant), {run_id: score})
                return made
        if entries:
            write.hset(keys.watch(tenant), run_id, str(entries[-1][0]))
        return made

    @staticmethod
    def _enqueue(
        write: Any, endpoint: Endpoint, kind: str, *, body: str, run_id: str, entry_id: str,
        now: int,
    ) -> None:  # fmt: skip
        did = delivery_id(endpoint.id, run_id, entry_id)
        record = Delivery(did, endpoint.id, kind, body, now)
        write.hsetnx(keys.DELIVERIES, did, msgspec.json.encode(record))
        write.zadd(keys.OUTBOX, {did: now}, nx=True)


class Sender:
    """Delivers due outbox entries on a thread pool and records how each attempt went."""

    def __init__(self, r: redis.Redis, settings: ApiSettings) -> None:
        self.r, self.settings = r, settings
        self.pool = ThreadPoolExecutor(settings.webhook_concurrency, "webhook")
        self.inflight: set[str] = set()
        self.lock = threading.Lock()
        self.local = threading.local()
        self.targets = target_checker(settings)

    def tick(self) -> None:
        now = server_ms(self.r)
        due = [str(d) for d in self.r.zrangebyscore(keys.OUTBOX, "-inf", now, start=0,
                                                     num=DUE_PER_TICK)]  # fmt: skip
        lease_ms = int((self.settings.webhook_timeout_s + 5) * 1000)
        for did in due:
            with self.lock:
                if did in self.inflight:
                    continue
                self.inflight.add(did)
            # Pushed back for the attempt's length: if this process dies mid-attempt, the
            # next deliverer tries again after that.
            self.r.zadd(keys.OUTBOX, {did: now + lease_ms}, xx=True)
            self.pool.submit(self._attempt, did)

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

    def _attempt(self, did: str) -> None:
        try:
            self._deliver(did)
        except redis.RedisError as exc:
            log.warning("webhook_store_error", delivery=did, error=one_line(str(exc)))
        except Exception:  # a bug here must show in the log, not vanish with the future
            log.exception("webhook_attempt_failed", delivery=did)
        finally:
            with self.lock:
                self.inflight.discard(did)

    def _deliver(self, did: str) -> None:
        raw = self.r.hget(keys.DELIVERIES, did)
        endpoint_raw = None
        try:
            if raw is not None:
                delivery = msgspec.json.decode(raw, type=Delivery)
                endpoint_raw = self.r.hget(keys.WEBHOOKS, delivery.endpoint)
            if raw is None or endpoint_raw is None:  # delivered already, or the endpoint is gone
                self._forget(did)
                return
            endpoint = msgspec.json.decode(endpoint_raw, type=Endpoint)
        except msgspec.DecodeError as exc:  # nothing to count attempts on: dropped, once
            log.warning("webhook_delivery_unreadable", delivery=did, error=one_line(str(exc)))
            self._forget(did)
            return
        code, error = self._post(endpoint, delivery)
        delivery.attempts += 1
        now = server_ms(self.r)
        ok = 200 <= code < 300
        gave_up = not ok and now - delivery.first_ms >= self.settings.webhook_retry_for_s * 1000
        result = "delivered" if ok else "gave_up" if gave_up else "retrying"
        self._record(endpoint, delivery, code=code, error=error, now=now, result=result)
        if ok or gave_up:
            self._forget(did)
            return
        wait_s = backoff_s(delivery.attempts, base_s=self.settings.webhook_backoff_base_s,
                           max_s=self.settings.webhook_backoff_max_s)  # fmt: skip
        pipe = self.r.pipeline(transaction=False)
        pipe.hset(keys.DELIVERIES, did, msgspec.json.encode(delivery))
        pipe.zadd(keys.OUTBOX, {did: now + int(wait_s * 1000)})
        pipe.execute()

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
        result: str,
    ) -> None:  # fmt: skip
        status = {
            "delivery": delivery.id, "type": delivery.event, "status_code": code,
            "error": error, "attempts": delivery.attempts, "at_ms": now, "result": result,
        }  # fmt: skip
        self.r.hset(keys.WEBHOOK_STATUS, endpoint.id, msgspec.json.encode(status))
        log.info("webhook_attempt", endpoint=endpoint.id, tenant=endpoint.tenant, **status)

    def _forget(self, did: str) -> None:
        pipe = self.r.pipeline(transaction=False)
        pipe.zrem(keys.OUTBOX, did)
        pipe.hdel(keys.DELIVERIES, did)
        pipe.execute()

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
        if self.r.set(keys.DELIVERY_LOCK, self.owner, nx=True, px=lease_ms):
            return True
        if self.r.get(keys.DELIVERY_LOCK) == self.owner:
            self.r.pexpire(keys.DELIVERY_LOCK, lease_ms)
            return True
        return False

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
        if self.r.get(keys.DELIVERY_LOCK) == self.owner:
            self.r.delete(keys.DELIVERY_LOCK)


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
