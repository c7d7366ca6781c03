"""Retention: nothing in the store grows for good.

A finished run is kept `retain_finished_s` after it ended (`TURNSTILE_RETAIN_FINISHED_S`, three
days by default), then removed with everything that names it: its hash, its event stream, its
entries in the tenant's runs, status and outcome indexes, its lease and in-flight entries
(`run_expire.lua`, one atomic script per run), and its entry in the run-tenants map. After
that its id is forgotten: submitting it again makes a new run. The ledger's period buckets
that have ended and that no reservation still books in are pruned (`Ledger.prune_periods`).

The sweeper's timer calls `run_due` in every worker; one of them at a time does a pass (a lock
key that lapses after `retention_interval_s`), so a pass runs about once an interval. A pass
walks each tenant's runs index from the oldest, only as far as runs created before the
cutoff (a run ends after it was created), and removes at most `MAX_PER_TENANT` runs per
tenant, so it stays short; the next pass goes on where this one stopped.
"""

from __future__ import annotations

from dataclasses import dataclass

import redis
import structlog
from redis.commands.core import Script

from turnstile.jobs.outcomes import Status
from turnstile.ledger.client import Ledger
from turnstile.worker.settings import Settings
from turnstile.worker.store import fields, locks, run_index, tenants
from turnstile.worker.store.values import server_ms, text

log = structlog.get_logger("turnstile.retention")

BATCH = 200  # runs read and removed per round trip
MAX_PER_TENANT = 2000  # runs removed per tenant per pass: bounds how long a pass takes


@dataclass(frozen=True)
class Retained:
    """What one retention pass removed."""

    runs: int  # finished runs removed
    buckets: int  # ledger period buckets pruned, over every tenant


def run_due(client: redis.Redis, config: Settings, ledger: Ledger) -> Retained | None:
    """A retention pass, unless another worker did one less than an interval ago."""
    interval_ms = max(100, int(config.retention_interval_s * 1000))
    if not locks.once_per(client, locks.RETENTION, interval_ms):
        return None
    done = retain(client, config, ledger)
    if done.runs or done.buckets:
        log.info("retention_pass", runs_removed=done.runs, buckets_pruned=done.buckets)
    return done


def retain(client: redis.Redis, config: Settings, ledger: Ledger) -> Retained:
    """One pass over every tenant: remove the runs that ended before the cutoff, prune the
    ledger's old period buckets."""
    cutoff_ms = server_ms(client) - int(config.retain_finished_s * 1000)
    expire = run_index.expirer(client)
    runs = buckets = 0
    for tenant in tenants.scan(client, BATCH):
        runs += expire_runs(client, expire, tenant, cutoff_ms)
        buckets += len(ledger.prune_periods(tenant))
    return Retained(runs, buckets)


def expire_runs(client: redis.Redis, expire: Script, tenant: str, cutoff_ms: int) -> int:
    """Remove the tenant's runs that ended at or before `cutoff_ms`; returns how many."""
    removed, skipped = 0, 0
    while removed < MAX_PER_TENANT:
        # Runs created before the cutoff, oldest first, past the ones kept on this pass.
        ids = run_index.created_before(client, tenant, cutoff_ms, skip=skipped, most=BATCH)
        if not ids:
            break
        due = _due(client, tenant, ids, cutoff_ms)
        gone = run_index.expire(client, expire, tenant, due, cutoff_ms)
        skipped += len(ids) - gone
        removed += gone
    return removed


def _due(client: redis.Redis, tenant: str, ids: list[str], cutoff_ms: int) -> list[tuple[str, str]]:
    """(run id, outcome) of the runs among `ids` that are stopped and ended by the cutoff, and
    of entries with no run behind them."""
    found = run_index.fields_of_runs(
        client, [(tenant, run_id) for run_id in ids], fields.STATUS, fields.UPDATED_MS,
        fields.OUTCOME,
    )  # fmt: skip
    due = []
    for run_id, (status, updated, outcome) in zip(ids, found, strict=True):
        ended = text(status) == Status.STOPPED.value and int(text(updated) or 0) <= cutoff_ms
        if status is None or ended:
            due.append((run_id, text(outcome)))
    return due
