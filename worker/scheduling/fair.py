"""Fair share between tenants and per-tenant caps on turns in flight.

A Celery queue is first come, first served: a tenant that enqueues thousands of runs makes
every other tenant wait behind all of them. So a step message does not go straight to the
broker: `route` (the one place that decides where a step goes) puts it in its tenant's pending
set on its queue (continuations and first steps apart, in the tenant's hash slot, ordered by
the run's priority and the time queued: see fair_lib.lua and priority.py), and the dispatcher
(dispatcher.py) moves steps from the tenants' sets to the broker, round robin between
tenants, each tenant's by effective priority, skipping a tenant at its cap on turns in flight.
A step takes a slot when dispatched and gives it back when its delivery is done (`release`),
which nudges the dispatcher: a capped tenant's next step waits in Redis, holding no worker and
re-publishing nothing, and goes as soon as one of its turns ends.

A turn's commit queues its run's next step itself (run_commit.lua, through fair_lib.lua), so
the step exists if and only if the commit does. A slot whose step was lost lapses by itself
(the step's hard limit plus the pickup lease). With `TURNSTILE_FAIR_SHARE=0` every step is
published at once, as before.

The rules are here; the pending sets, slots and the rest of fair share's keys are read and
written by worker/store/pending.py.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping

import redis

from turnstile.errors import TurnstileError
from turnstile.worker.broker.message import StepMessage
from turnstile.worker.settings import Settings
from turnstile.worker.store import pending, tenants
from turnstile.worker.store.connect import is_cluster
from turnstile.worker.store.pending import (
    Pending,
    TenantView,
    counts,
    queue_allows_claim,
    tenant_view,
)
from turnstile.worker.store.records import Claim
from turnstile.worker.store.run_calls import inflight_tag

# Fair share's data, read and written by worker/store/pending.py; named here as before.
__all__ = [
    "CAPS", "REMOVABLE", "CapError", "Pending", "TenantView", "aging_ms", "claim",
    "parse_caps", "pending_counts", "pending_entry", "queue_allows_claim", "release", "route",
    "sent_window_ms", "set_caps", "slot_extra_ms", "tenant_view",
]  # fmt: skip

Publish = Callable[[StepMessage, float, float], None]
CAPS = ("turns_in_flight", "active_runs", "weight")  # what `turnstile tenants set` accepts
REMOVABLE = ("turns_in_flight", "active_runs")  # NAME=none removes it; a weight is 1 by default
pending_counts = counts  # what counts the backlog reads the pending sets' sizes through


class CapError(TurnstileError):
    """A tenant setting that is not a setting (a negative cap, a weight of zero, ...)."""


# -- routing: the one function that says where a step message goes ---------------------------


def route(
    client: redis.Redis, config: Settings, publish: Publish
) -> Callable[[StepMessage, float, float], None]:
    """The send function every sender uses (the client, the sweeper, resume, and a step's
    next step where its commit did not queue it): straight to the broker with fair share
    off, else into the tenant's pending list."""
    if not config.fair_share:
        return publish
    pusher = pending.Pusher(client)

    def send(msg: StepMessage, soft_s: float, hard_s: float) -> None:
        pusher.push(pending_entry(msg, soft_s, hard_s))

    return send


def pending_entry(msg: StepMessage, soft_s: float, hard_s: float) -> Pending:
    """The pending-set entry of a step message: continuations and first steps apart (its
    priority is its run's, read by the script that queues it)."""
    entry = json.dumps(
        {**msg.as_kwargs(), "soft_s": soft_s, "hard_s": hard_s}, separators=(",", ":")
    )
    return pending.queued(msg.tenant, msg.queue, msg.run_id, msg.version, entry)


def claim(msg: StepMessage, hard_s: float, config: Settings, token: str) -> Claim:
    """What a commit needs to claim the run's next step `msg` for this worker (eager
    continuation; see run_commit.lua for the check), to be loaded as delivery `token`. The
    claimed step's slot lapses as a dispatched one's does (fair_take.lua): its hard limit and
    the pickup lease; another tenant's step sent to the broker counts as waiting for a pickup
    lease, after which it is taken as lost (the sweeper sends it again, through its pending
    list)."""
    args = [msg.tenant, str(int(config.inflight_lease_s * 1000)), inflight_tag(msg.queue),
            token, str(sent_window_ms(config)), str(slot_extra_ms(config) + int(hard_s * 1000)),
            msg.queue]  # fmt: skip
    aging = str(aging_ms(config))
    if config.redis_url is not None and is_cluster(config.redis_url):
        # The queue's keys are in no tenant's slot: read before the commit (queue_allows).
        window = sent_window_ms(config)
        return Claim(
            keys=pending.claim_keys(msg.tenant, msg.queue, split=True), args=[*args, "1", aging],
            queue_allows=lambda client: queue_allows_claim(client, msg.tenant, msg.queue, window),
        )  # fmt: skip
    return Claim(keys=pending.claim_keys(msg.tenant, msg.queue, split=False),
                 args=[*args, "", aging])  # fmt: skip


def aging_ms(config: Settings) -> int:
    """How long a pending step waits to gain a priority level (see fair_lib.lua), at least 1."""
    return max(1, int(config.priority_aging_s * 1000))


def slot_extra_ms(config: Settings) -> int:
    """How long a step's slot outlives its hard time limit: time to wait on the queue (the
    pickup lease), whether the dispatcher took the step (fair_take.lua) or a commit claimed it."""
    return int(config.pickup_lease_s * 1000)


def sent_window_ms(config: Settings) -> int:
    """How long a step sent to the broker counts as waiting there (see keys.fair_sent)."""
    return int(config.pickup_lease_s * 1000)


def release(
    client: redis.Redis, tenant: str, run_id: str, version: int, *, ended: bool = False
) -> None:
    """The step's delivery is done (committed, skipped, failed): give its slot back (and, if
    the run `ended`, its place among the active runs) and nudge the dispatcher, so the
    tenant's next step goes now."""
    pending.release(client, tenant, run_id, version, ended=ended)


# -- caps -----------------------------------------------------------------------------------


def parse_caps(pairs: Iterable[str]) -> dict[str, int | None]:
    """`turns_in_flight=20 active_runs=100 weight=2` as settings; `NAME=none` removes a cap.
    Every pair is checked before anything is written."""
    out: dict[str, int | None] = {}
    for pair in pairs:
        name, sep, raw = pair.partition("=")
        if not sep or name not in CAPS:
            raise CapError(f"bad setting {pair!r}: expected NAME=VALUE, NAME one of {CAPS}")
        if raw in ("none", "") and name in REMOVABLE:
            out[name] = None
            continue
        if not raw.isdigit():
            raise CapError(f"{name} must be a whole number >= {_least(name)}, not {raw!r}")
        value = int(raw)
        if value < _least(name):
            raise CapError(f"{name} must be a whole number >= {_least(name)}, not {raw!r}")
        out[name] = value
    if not out:
        raise CapError(f"nothing to set: give NAME=VALUE, NAME one of {CAPS}")
    return out


def _least(name: str) -> int:
    # A weight of 0 would never be served; a cap of 0 is a pause, which `pause` says better.
    return 1


def set_caps(client: redis.Redis, tenant: str, caps: Mapping[str, int | None]) -> None:
    """Write a tenant's settings (a tenant not seen yet is allowed: they apply from its first
    submission). Removing a cap wakes the dispatcher, so steps waiting on it go at once."""
    tenants.set_settings(client, tenant, caps)
    pending.wake(client)  # then the nudge (another slot on a cluster)
