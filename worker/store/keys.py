"""Every Redis key of the worker, built in one place.

A run's keys carry its tenant's hash tag, the same one the ledger's keys carry, so the commit
script can compare-and-set the run and settle the tenant's reservation in one slot.
"""

from __future__ import annotations

from turnstile.ledger.keys import tenant_keys as ledger_tenant_keys

PREFIX = "turnstile"

TENANTS = f"{PREFIX}:tenants"  # every tenant that has runs: the sweeper's starting point
SWEEP_LOCK = f"{PREFIX}:sweeper:lock"
RETENTION_LOCK = f"{PREFIX}:retention:lock"  # one retention pass at a time, once an interval
RUN_TENANTS = f"{PREFIX}:run-tenants"  # hash: run id -> tenant, so a run id alone finds its run
EVAL_TENANTS = f"{PREFIX}:eval-tenants"  # hash: evaluation id -> its tenant (store/evals.py)
FENCE = f"{PREFIX}:fence"  # counter: a reader's own write, to wait for what it read (store.fence)


def _t(tenant: str, name: str) -> str:
    return f"{PREFIX}:{{{tenant}}}:{name}"


def run(tenant: str, run_id: str) -> str:
    """Hash: state, version, status, outcome, detail, reason, queue, job, user, attempts..."""
    return _t(tenant, f"run:{run_id}")


def events(tenant: str, run_id: str) -> str:
    """Stream: the run's events, appended by the same script that commits the state."""
    return _t(tenant, f"events:{run_id}")


def live(tenant: str, run_id: str) -> str:
    """Stream: the run's live output (worker/store/live.py), apart from its events: bounded,
    expiring, never the truth."""
    return _t(tenant, f"live:{run_id}")


def live_readers(tenant: str, run_id: str) -> str:
    """String with a time to live: someone reads the run's live output (worker/store/live.py);
    set again by each reader as it reads, gone a little after the last one left."""
    return _t(tenant, f"live-readers:{run_id}")


def runs(tenant: str) -> str:
    """Sorted set: the tenant's run ids by creation time (ms)."""
    return _t(tenant, "runs")


def by_status(tenant: str, status: str) -> str:
    return _t(tenant, f"status:{status}")


def by_outcome(tenant: str, outcome: str) -> str:
    return _t(tenant, f"outcome:{outcome}")


def conversation(tenant: str, key: str) -> str:
    """Hash: a conversation of the tenant's: `active` (the run id of its one active run, absent
    when none), and `m:<submission id>` -> "<run id>|<fingerprint>" for each idempotent
    submission merged into one of its runs (a retry finds where it went)."""
    return _t(tenant, f"conv:{key}")


def conversation_waiting(tenant: str, key: str) -> str:
    """List: the conversation's waiting runs (enqueued, or interrupting at the front), in the
    order they start."""
    return _t(tenant, f"conv-waiting:{key}")


def evaluation(tenant: str, eval_id: str) -> str:
    """Hash: an evaluation of the tenant's: `spec` (JSON: the variant, the mode, the origins
    chosen), `status` (submitting, submitted), `created_at`."""
    return _t(tenant, f"eval:{eval_id}")


def evaluation_runs(tenant: str, eval_id: str) -> str:
    """Hash: an evaluation's runs, origin run id -> the evaluation's run of it."""
    return _t(tenant, f"eval-runs:{eval_id}")


def evaluations(tenant: str) -> str:
    """Sorted set: the tenant's evaluation ids by creation time (ms)."""
    return _t(tenant, "evals")


def leases(tenant: str) -> str:
    """Sorted set: run id scored by when its lease lapses (server ms)."""
    return _t(tenant, "leases")


def control(tenant: str) -> str:
    """Hash: the tenant's operator flags (paused, by, at)."""
    return _t(tenant, "control")


def inflight(tenant: str) -> str:
    """Hash: run id -> "<queue>|<pid>|<host>|<delivery token>|<lease ms>" for turns running
    now, with the time their in-flight lease lapses; a drain waits for its queue's live turns
    to end."""
    return _t(tenant, "inflight")


def queue_control(queue: str) -> str:
    """Hash: a queue's operator flags (paused, draining, by, at). Not tenant-tagged: a queue is
    shared by tenants, and it is read in the same pipeline as the run, not inside a script."""
    return f"{PREFIX}:queue:{queue}"


QUEUES = f"{PREFIX}:queues"  # every queue that has been used, controlled or served
# Hash: queue -> when a worker last started on it (ms): the queues the workers serve, which a
# client may submit to by default (worker/store/queues.py).
SERVED_QUEUES = f"{PREFIX}:queues:served"
# Sorted set: "<job>|<version>|<fingerprint>|<worker>" by when its heartbeat lapses (ms): the
# job versions each live worker serves (store/versions.py).
JOB_VERSIONS = f"{PREFIX}:job-versions"
# Set: "<tenant>|<run id>" of the runs parked for a worker of their job's version, so a worker's
# heartbeat looks at them and not at every parked run (scheduling/versions.py).
VERSION_WAITING = f"{PREFIX}:version-waiting"
# Hash: queue -> what the dispatcher last met on it ("<ms>|<error>"), while it is broken.
BROKEN_QUEUES = f"{PREFIX}:queues:broken"

# On the broker, beside the queues: what workers took off a queue and could not run.
DEAD_LETTER_QUEUES = f"{PREFIX}:dead"  # set: the queues that have dead letters


def dead_letters(queue: str) -> str:
    """List, on the broker: the queue's dead letters as JSON, newest first."""
    return f"{PREFIX}:dead:{queue}"


# -- long-term memory: every key of a tenant's notes carries the tenant's hash tag -------------


def memory_notes(tenant: str, user_id: str) -> str:
    """Sorted set: one user's note records (JSON), scored by when each expires (seconds)."""
    return _t(tenant, f"mem:notes:{user_id}")


def memory_seq(tenant: str, user_id: str) -> str:
    """Counter: the last sequence number given to a note of this user."""
    return _t(tenant, f"mem:seq:{user_id}")


def memory_users(tenant: str) -> str:
    """Set: every user of the tenant that was ever given a note (`memory list` walks it)."""
    return _t(tenant, "mem:users")


def memory_source_users(tenant: str, source: str) -> str:
    """Set: every user of the tenant that was ever given a note from `source`."""
    return _t(tenant, f"mem:source:{source}:users")


def ledger(tenant: str) -> list[str]:
    return ledger_tenant_keys(tenant)


# -- fair share: each tenant's steps wait in lists of its own until the dispatcher sends them --


def pending(tenant: str, queue: str, kind: str) -> str:
    """Sorted set: the tenant's step entries (JSON) waiting for the dispatcher on `queue`,
    scored by their run's priority level and when they were queued (see fair_lib.lua); `kind`
    is "cont" (a run's later steps, taken first within a level) or "start" (new runs' first
    steps). Named `waiting`: the lists of before priorities were `pending` (a step left in one
    is sent again by the sweeper)."""
    return _t(tenant, f"waiting:{queue}:{kind}")


def pending_index(tenant: str) -> str:
    """Hash: run id -> the version of its step waiting in a pending set (a re-send of a step
    that waits is not queued twice)."""
    return _t(tenant, "waiting-index")


def slots(tenant: str) -> str:
    """Sorted set: "<run id>:<version>" of each step dispatched and not yet done, scored by
    when the slot lapses (server ms): the tenant's turns in flight, against its cap."""
    return _t(tenant, "slots")


def caps(tenant: str) -> str:
    """Hash: the tenant's scheduling settings (turns_in_flight, active_runs, weight); not spend."""
    return _t(tenant, "caps")


def active(tenant: str) -> str:
    """Sorted set: run id -> when its first step was dispatched (ms), until the run ends: the
    tenant's active runs, against its cap."""
    return _t(tenant, "active")


FAIR_QUEUES = f"{PREFIX}:fair:queues"  # set: the queues that may have pending steps
FAIR_LOCK = f"{PREFIX}:fair:lock"  # one dispatcher at a time
FAIR_WAKE = f"{PREFIX}:fair:wake"  # list: a push or a finished step nudges the dispatcher


def fair_active(queue: str) -> str:
    """Set: the tenants that may have steps pending on `queue`."""
    return f"{PREFIX}:fair:active:{queue}"


def fair_sent(queue: str) -> str:
    """Zset: "<tenant>|<run id>:<version>" of each step the dispatcher sent to the broker on
    `queue` that no delivery has loaded yet, scored by when it was sent (ms) plus its run's
    priority as the fraction (priority + 1) / 16 (pending.py `sent_score`). While another
    tenant's step here waits for a worker, or a continuation of the same tenant's of a higher
    priority, no commit claims its own next step (eager continuation, see run_commit.lua)."""
    return f"{PREFIX}:fair:sent:{queue}"


def fair_capacity(queue: str) -> str:
    """Zset: "<worker>|<turns it can hold in flight>" of each live worker reading `queue`,
    scored by when its announcement lapses (ms)."""
    return f"{PREFIX}:fair:capacity:{queue}"


# -- provider rate limits: every key of one endpoint's buckets carries the endpoint's hash tag --


RATE_ENDPOINTS = f"{PREFIX}:rl:endpoints"  # set: the endpoints with a limit (workers cache it)
DEFERRED_TENANTS = f"{PREFIX}:fair:deferred"  # set: tenants with steps waiting out a rate limit


def _rl(endpoint: str, name: str) -> str:
    return f"{PREFIX}:{{rl:{endpoint}}}:{name}"


def rate_bucket(endpoint: str, tenant: str = "") -> str:
    """Hash: the limits set on a model endpoint (rpm, tpm), for every tenant or, with `tenant`,
    one tenant's share of it, and its buckets' state (levels, when last refilled, blocked
    until after a 429). In the endpoint's slot, never a tenant's: a draw is its own script."""
    return _rl(endpoint, f"tenant:{tenant}" if tenant else "bucket")


def rate_tenants(endpoint: str) -> str:
    """Set: the tenants with a limit of their own on the endpoint."""
    return _rl(endpoint, "tenants")


def rate_paid(endpoint: str) -> str:
    """Sorted set: "<tenant>|<run id>:<version>" of each deferred step whose turn has drawn
    from the buckets already, scored by when its wait ends (ms): its draw then takes nothing."""
    return _rl(endpoint, "paid")


def deferred(tenant: str) -> str:
    """Sorted set: the tenant's step entries (JSON, as its pending lists hold them) deferred by
    a rate limit, scored by when they may go (ms); the dispatcher moves them to the pending
    lists when due."""
    return _t(tenant, "deferred")


def shop(tenant: str, name: str, part: str) -> str:
    """The demo shop (worker/dev/shop.py): `part` (orders, done or effects) of one shop of the
    tenant's, by the name its runs give (`params.shop`, else the run's id). The tenant's hash
    tag comes first, so a tenant's shops are apart from every other tenant's whatever their
    names, and a shop's keys share one slot."""
    return f"{PREFIX}:shop:{{{tenant}}}:{name}:{part}"
