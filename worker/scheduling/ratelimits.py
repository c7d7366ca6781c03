"""Provider rate limits, shared by every worker: requests and tokens per minute per model
endpoint (a model string, `openai:gpt-4.1-mini`), and optionally a tenant's own share of one.

Each limited endpoint has token buckets in the store (worker/store/limits.py, in the endpoint's
hash slot): the endpoint's, and a tenant's where it has a limit of its own. A bucket lets `burst_s`
seconds' worth of its limit go at once (DEFAULT_BURST_S: a second's, at least one request) and
refills so that no 60 s passes more than the limit (`shape`, rl_lib.lua), whatever window the
provider counts in. Before a turn calls a
limited model, its step draws one request and the turn's worst case of tokens from them in
one script (rl_draw.lua); after the call the tokens it did not use are given back
(rl_adjust.lua). A turn that does not fit is deferred: its step commits the wait and holds
nothing (no pool slot, no ledger hold, no slot of its tenant's turns in flight), and its next
step waits in the tenant's deferred set until the bucket says it may go, when the dispatcher
queues it like any other step (`promote_due`). The deferred turn drew already (the bucket goes
below zero), so the turns deferred after it wait longer, each for its own turn, and its next
step's draw takes nothing. A 429 from the provider empties the endpoint's bucket for every
worker until the wait it asked for has passed (`Buckets.block`).

Which endpoints have limits is read by each worker process at most every CACHE_S, so a turn of
an endpoint without one costs no round trip, and `turnstile limits set` applies within that.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import redis
import structlog

from turnstile.errors import InvalidNameError, TurnstileError
from turnstile.worker.broker.message import StepMessage
from turnstile.worker.names import check_name
from turnstile.worker.scheduling.fair import pending_entry
from turnstile.worker.store import limits as stored
from turnstile.worker.store import pending
from turnstile.worker.store.errors import StoreUnavailable
from turnstile.worker.store.scripts import RL, evalsha, register, with_scripts
from turnstile.worker.store.values import server_ms

if TYPE_CHECKING:
    from turnstile.providers.config import ProviderConfig

log = structlog.get_logger("turnstile.ratelimits")

# What `turnstile limits set` accepts: requests and tokens per minute.
LIMITS = (stored.RPM, stored.TPM)
MAX_LIMIT = 10**12
BURST = "burst_s"  # seconds' worth of a bucket's limits that may go at once
# A second's worth: OpenAI and Anthropic both say a per-minute limit may be enforced over
# shorter periods (60 rpm as one request a second), so a minute's worth at once after a lull
# meets their 429. rl_lib.lua's RL_BURST_S says the same.
DEFAULT_BURST_S = 1
MAX_BURST_S = 30  # half a minute's worth at once: the other half refills over the minute
# Seconds a window of 60 s is stretched by: a request may reach the provider this much later
# than the one drawn before it without two windows' worth meeting. rl_lib.lua's RL_SLACK_S.
SLACK_S = 1
CACHE_S = 2.0  # how long a worker process trusts its list of limited endpoints
DUE_BATCH = 500  # deferred steps one pass of the dispatcher moves per tenant, at most
# With no step deferred, the dispatcher looks again at most this often (a pass a commit would
# otherwise pay a round trip for nothing); a step deferred meanwhile waits at least its wait.
IDLE_LOOK_S = 0.25


class RateLimitError(TurnstileError):
    """A rate limit that is not one: an unknown endpoint, a limit of zero or below, a value
    that is not a whole number. Nothing was written."""


# -- operators: set, unset, show --------------------------------------------------------------


def check_endpoint(endpoint: str, providers: ProviderConfig) -> str:
    """A model endpoint a limit may be set on: a name by the one rule for endpoints
    (worker/names.py: no control characters, braces or '|'), whose provider is known in
    `providers` (`openai`, `anthropic` or a named endpoint of TURNSTILE_MODEL_ENDPOINTS)."""
    from turnstile.providers import parse  # noqa: PLC0415 - the providers' table, on demand
    from turnstile.providers.errors import ProviderConfigError  # noqa: PLC0415

    try:
        check_name("endpoint", endpoint)
    except InvalidNameError as exc:
        raise RateLimitError(str(exc)) from None
    try:
        parse(endpoint, providers)
    except ProviderConfigError as exc:
        raise RateLimitError(f"unknown endpoint {endpoint[:80]!r}: {exc}") from None
    return endpoint


def parse_limits(pairs: Iterable[str]) -> dict[str, int]:
    """`rpm=500 tpm=200000 burst_s=1` as limits; each a whole number from 1 (burst_s from 0 to
    MAX_BURST_S), checked before any write."""
    out: dict[str, int] = {}
    for pair in pairs:
        name, sep, raw = pair.partition("=")
        if not sep or name not in (*LIMITS, BURST):
            raise RateLimitError(
                f"bad limit {pair!r}: expected NAME=VALUE, NAME one of {(*LIMITS, BURST)}"
            )
        value = raw.strip()
        low, high = (0, MAX_BURST_S) if name == BURST else (1, MAX_LIMIT)
        if not value.isdigit() or not low <= int(value) <= high:
            raise RateLimitError(
                f"{name} must be a whole number from {low} to {high}, not {raw[:40]!r}"
            )
        out[name] = int(value)
    if not out:
        raise RateLimitError(f"nothing to set: give NAME=VALUE, NAME one of {(*LIMITS, BURST)}")
    return out


def shape(limit: int, burst_s: int) -> tuple[int, float]:
    """A limit per minute as its bucket keeps it (rl_lib.lua rl_shape): what it holds, its
    burst (`burst_s` seconds' worth, at least one), and what it refills per ms, (limit -
    burst + 1) per 60 + SLACK_S seconds: no window shorter than that passes more than `limit`."""
    cap = min(limit, max(1, limit * burst_s // 60))
    return cap, (limit - cap + 1) / ((60 + SLACK_S) * 1000)


def parse_names(names: Iterable[str]) -> list[str]:
    """The limits `limits unset` removes: some of LIMITS, or all of them when none is named."""
    chosen = list(names) or list(LIMITS)
    for name in chosen:
        if name not in LIMITS:
            raise RateLimitError(f"unknown limit {name[:40]!r}: one of {LIMITS}")
    return chosen


def _check_tenant(tenant: str | None) -> None:
    if tenant is not None:
        check_name("tenant", tenant)


def set_limits(
    client: redis.Redis, endpoint: str, limits: Mapping[str, int], tenant: str | None = None,
    *, providers: ProviderConfig,
) -> None:  # fmt: skip
    """Set an endpoint's limits, or a tenant's own share of it, and its burst; checked before
    anything is written (the endpoint against `providers`). A bucket starts full; a lower
    limit or burst caps its level at once."""
    check_endpoint(endpoint, providers)
    _check_tenant(tenant)
    if not set(limits) & set(LIMITS) and not stored.has_limit(client, endpoint, tenant or ""):
        raise RateLimitError(
            f"{BURST} alone limits nothing: {_whose(endpoint, tenant)} has no limit; "
            "give rpm=N or tpm=N with it"
        )
    stored.write(client, endpoint, limits, tenant or "")


def _whose(endpoint: str, tenant: str | None) -> str:
    return f"{endpoint} (tenant {tenant})" if tenant else endpoint


def unset_limits(
    client: redis.Redis, endpoint: str, names: Iterable[str] = (), tenant: str | None = None,
    *, providers: ProviderConfig,
) -> list[str]:  # fmt: skip
    """Remove limits (all of them by default) from an endpoint or a tenant's share of it;
    the limits removed. Turns of an endpoint left without limits draw nothing."""
    check_endpoint(endpoint, providers)
    _check_tenant(tenant)
    return stored.remove(client, endpoint, parse_names(names), tenant or "")


@dataclass(frozen=True)
class LimitView:
    endpoint: str
    tenant: str  # "" for the endpoint's own limits
    rpm: int | None
    tpm: int | None
    burst_s: int  # seconds' worth of each limit that may go at once
    requests_left: float | None  # what may go now, from 0 (turns deferred on it wait meanwhile)
    tokens_left: float | None
    blocked_for_s: float  # a 429's wait still to run
    deferred: int  # steps deferred that drew already and wait for their turn (endpoint only)


def show_limits(
    client: redis.Redis, endpoint: str | None = None, *, providers: ProviderConfig
) -> list[LimitView]:
    """Every limit set (or those of one endpoint, checked against `providers`), with its
    buckets' levels now."""
    if endpoint is not None:
        check_endpoint(endpoint, providers)
    names = [endpoint] if endpoint else stored.endpoints(client)
    now = server_ms(client)
    out = []
    for name in names:
        tenants = stored.tenants(client, name)
        paid = stored.paid_waiting(client, name, now)
        for tenant in ["", *tenants]:
            view = _view(client, name, tenant, now, paid if not tenant else 0)
            if view is not None:
                out.append(view)
    return out


def _view(client: redis.Redis, endpoint: str, tenant: str, now: int, paid: int) -> LimitView | None:
    rpm, tpm, r, t, at, blocked, burst = stored.bucket(client, endpoint, tenant)
    if rpm is None and tpm is None:
        return None
    elapsed = max(0, now - int(at or now))
    burst_s = int(burst) if burst is not None else DEFAULT_BURST_S

    def left(limit: Any, stored: Any) -> float | None:
        """The level now, as rl_read computes it, and never below zero: a level below zero is
        the debt of turns deferred on it, which they wait out, not a remainder."""
        if limit is None:
            return None
        cap, per_ms = shape(int(limit), burst_s)
        level = min(cap, (float(stored) if stored else cap) + elapsed * per_ms)
        return round(max(0.0, level), 2)

    return LimitView(
        endpoint, tenant, int(rpm) if rpm else None, int(tpm) if tpm else None, burst_s,
        left(rpm, r), left(tpm, t), max(0, int(blocked or 0) - now) / 1000, paid,
    )  # fmt: skip


# -- workers: draw, give back, block ----------------------------------------------------------


@dataclass(frozen=True)
class Draw:
    """A bucket's answer: go now, wait `wait_ms` (deferred, drawn already), or `late`: the wait
    would outlast the run's deadline (nothing drawn). `which` names the limit that said so."""

    kind: str  # "go" | "wait" | "late"
    wait_ms: int = 0
    which: str = ""


GO = Draw("go")


class Buckets:
    """A worker process's side of the shared buckets."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self._draw = register(client, "rl_draw", RL)
        self._adjust = register(client, "rl_adjust", RL)
        self._limited: frozenset[str] = frozenset()
        self._read_at = -CACHE_S
        self._lock = threading.Lock()

    def limited(self, endpoint: str | None) -> bool:
        """Whether the endpoint has limits (as read at most CACHE_S ago)."""
        if not endpoint:
            return False
        now = time.monotonic()
        if now - self._read_at >= CACHE_S:
            with self._lock:
                if now - self._read_at >= CACHE_S:
                    try:
                        self._limited = stored.limited(self.client)
                    except redis.RedisError as exc:  # the load before said the store is up
                        log.warning("rate_limits_unread", error=str(exc))
                        return endpoint in self._limited
                    self._read_at = now
        return endpoint in self._limited

    def draw(
        self, endpoint: str, tenant: str, run_id: str, version: int, *, tokens: int,
        longest_ms: int,
    ) -> Draw:  # fmt: skip
        """Draw one request and `tokens` for the turn of step `version`; see rl_draw.lua. A
        store that does not answer is StoreUnavailable: the step is retried, as when its load
        finds the store down."""
        call = stored.draw_call(endpoint, tenant, run_id, version, tokens=tokens,
                                longest_ms=longest_ms)  # fmt: skip
        try:
            reply = self._draw(keys=call.keys, args=call.args)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            raise StoreUnavailable(f"store unavailable: {exc}") from exc
        kind = str(reply[0])
        if kind == "go":
            return GO
        return Draw(kind, int(reply[1]), str(reply[2]))

    def refund(self, endpoint: str, tenant: str, tokens: int) -> None:
        """Give back tokens a turn drew and did not use (negative: it used more)."""
        if tokens == 0:
            return
        call = stored.refund_call(endpoint, tenant, tokens)
        try:
            self._adjust(keys=call.keys, args=call.args)
        except redis.RedisError as exc:  # the bucket only refills a little later
            log.warning("rate_refund_failed", endpoint=endpoint, error=str(exc))

    def block(self, endpoint: str, wait_s: float | None) -> None:
        """The provider answered 429 for `endpoint`: nothing of the fleet calls it again before
        its wait (1 s when it named none) is over."""
        if not self.limited(endpoint):
            return
        wait_ms = int(1000 * (wait_s if wait_s is not None and wait_s > 0 else 1.0))
        call = stored.block_call(endpoint, wait_ms)
        try:
            self._adjust(keys=call.keys, args=call.args)
        except redis.RedisError as exc:
            log.warning("rate_block_failed", endpoint=endpoint, error=str(exc))
            return
        log.info("rate_blocked", endpoint=endpoint, wait_ms=wait_ms)
        from turnstile.worker.observability import metrics  # noqa: PLC0415

        metrics.provider_rate_limited(endpoint)


# -- the deferred step: kept by its tenant, queued by the dispatcher when due ----------------


def defer(
    client: redis.Redis, msg: StepMessage, soft_s: float, hard_s: float, wait_ms: int
) -> None:
    """Keep the step `msg` until `wait_ms` from now, then the dispatcher queues it (the run's
    lease, set by the commit that deferred it, covers the wait: the sweeper leaves it be)."""
    entry = pending_entry(msg, soft_s, hard_s).entry
    stored.defer(client, msg.tenant, entry, server_ms(client) + wait_ms)


class Promoter:
    """The dispatcher's part: queue the deferred steps whose wait is over."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self.due = register(client, "fair_due")
        self.pusher = pending.Pusher(client)
        self.idle_at = -IDLE_LOOK_S  # when a look last found nothing deferred (monotonic)

    def promote(self) -> float | None:
        """Queue every deferred step that is due; the seconds until the next one is, or None."""
        now = time.monotonic()
        if now - self.idle_at < IDLE_LOOK_S:
            return None
        tenants = stored.deferring(self.client)
        if not tenants:
            self.idle_at = now
            return None

        def take(pipe: Any) -> None:
            for tenant in tenants:
                call = stored.due_call(tenant, DUE_BATCH)
                evalsha(pipe, self.due, call.keys, call.args)

        replies = with_scripts(self.client, (self.due,), take)
        entries: list[str] = []
        soonest: float | None = None
        for tenant, reply in zip(tenants, replies, strict=True):
            *due, next_ms = reply
            entries += [str(e) for e in due]
            if int(next_ms) < 0 and not due:
                self._drop(tenant)
            elif int(next_ms) >= 0:
                wait = int(next_ms) / 1000
                soonest = wait if soonest is None else min(soonest, wait)
        if entries:
            self._queue(entries)
            soonest = 0.0
        return soonest

    def _queue(self, entries: list[str]) -> None:
        pendings = []
        for raw in entries:
            step = json.loads(raw)
            msg = StepMessage(
                str(step["tenant"]), str(step["run_id"]), int(step["version"]),
                str(step["queue"]), str(step.get("traceparent") or ""),
            )  # fmt: skip
            pendings.append(pending_entry(msg, float(step["soft_s"]), float(step["hard_s"])))
        # Nothing to give back: the deferring step's slot went when it was done.
        self.pusher.push_many(pendings)

    def _drop(self, tenant: str) -> None:
        """A tenant with nothing deferred leaves the set; a step deferred meanwhile re-adds it
        (its deferral adds the tenant after its entry, and we look after the removal)."""
        stored.drop_deferring(self.client, tenant)
