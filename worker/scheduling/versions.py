"""Runs that wait for a worker of their job's version, taken back when one serves it.

A step whose run is pinned to a version of its job that the worker running it does not
serve (and cannot migrate) parks the run, its reason beginning `WAITING_FOR_VERSION`
(runtime/gates.py `versioned`). Each worker, on its version heartbeat, looks for such runs of
the versions it serves and requeues each one exactly once: the run moves parked -> running
through the store's version compare-and-set, so of two workers racing only the one whose
commit won sends the step. The step goes to the run's queue, where a worker of another version
may take it first: that one parks it again (a commit, nothing run) and the next pass here sends
it again; a worker of its version that takes it keeps the run with eager continuation.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import redis
import structlog

from turnstile.jobs.errors import StateFormatError, UnknownJobError
from turnstile.jobs.job import Job
from turnstile.jobs.outcomes import Status
from turnstile.jobs.state import RunState
from turnstile.ledger.client import Ledger
from turnstile.worker.broker.message import StepMessage
from turnstile.worker.observability import metrics
from turnstile.worker.scheduling.limits import next_hold, time_limits
from turnstile.worker.settings import Settings
from turnstile.worker.store import fields, run_index, tenants
from turnstile.worker.store import versions as job_versions
from turnstile.worker.store.records import Change
from turnstile.worker.store.runs import RunStore
from turnstile.worker.store.values import now_iso, text
from turnstile.worker.store.versions import WAITING_FOR_VERSION

log = structlog.get_logger("turnstile.versions")

Send = Callable[[StepMessage, float, float], None]


@dataclass(frozen=True)
class Waiting:
    """A run parked for a worker of its job's version."""

    tenant: str
    run_id: str
    queue: str
    job: str
    version: str
    state: RunState


def _parked(client: redis.Redis) -> Iterator[tuple[str, list[str]]]:
    """Every parked run, a tenant's slice at a time: the full pass."""
    for tenant in tenants.names(client):
        for ids in run_index.in_status(client, tenant, Status.PARKED.value):
            yield tenant, ids


def _marked(client: redis.Redis) -> Iterator[tuple[str, list[str]]]:
    by_tenant: dict[str, list[str]] = {}
    for tenant, run_id in job_versions.marked_waiting(client):
        by_tenant.setdefault(tenant, []).append(run_id)
    yield from by_tenant.items()


def waiting(client: redis.Redis, *, full: bool = False) -> list[Waiting]:
    """The runs parked for a worker of their job's version: those marked so as they parked,
    or (`full`) every parked run looked at. A mark whose run has moved on is dropped."""
    found: list[Waiting] = []
    for tenant, ids in _parked(client) if full else _marked(client):
        rows = run_index.fields_of_runs(
            client, [(tenant, r) for r in ids], fields.STATUS, fields.REASON, fields.QUEUE,
            fields.STATE,
        )  # fmt: skip
        for run_id, (status, reason, queue, state_json) in zip(ids, rows, strict=True):
            if text(status) != Status.PARKED.value or not text(reason).startswith(
                WAITING_FOR_VERSION
            ):
                job_versions.unmark_waiting(client, tenant, run_id)
                continue
            try:
                state = RunState.from_json(text(state_json))
            except StateFormatError:
                continue
            found.append(Waiting(tenant, run_id, text(queue), state.job,
                                 state.job_version, state))  # fmt: skip
    return found


@dataclass
class Requeuer:
    """Sends back the runs waiting for one of the job versions `served` (job, version)."""

    store: RunStore
    ledger: Ledger
    config: Settings
    send: Send
    job: Callable[[str], Job]

    def requeue_served(self, served: set[tuple[str, str]], *, full: bool = False) -> list[str]:
        """One pass: every waiting run of a served version sent once; their run ids. The
        metric of the runs waiting for each served version is set from what it found."""
        sent = []
        found = dict.fromkeys(served, 0)
        for run in waiting(self.store.client, full=full):
            if (run.job, run.version) not in served:
                continue
            found[run.job, run.version] += 1
            if self.requeue(run):
                sent.append(run.run_id)
        metrics.versions_waiting(found)
        return sent

    def requeue(self, run: Waiting) -> bool:
        """The run back to running and its step sent, if this caller's commit won."""
        stored = run_index.fields_of(self.store.client, run.tenant, run.run_id,
                                     fields.VERSION, fields.STATUS)  # fmt: skip
        version, status = (text(v) for v in stored)
        if status != Status.PARKED.value or not version.isdigit():
            return False
        try:
            job = self.job(run.job)
        except UnknownJobError:
            return False
        state = run.state
        state.status = Status.RUNNING
        committed = self.store.commit(
            Change(
                tenant=run.tenant, run_id=run.run_id, version=int(version),
                old_status=Status.PARKED.value, status=Status.RUNNING.value,
                state_json=state.to_json().decode(),
                lease_ms=int(self.config.pickup_lease_s * 1000),
                events=[{"type": "resumed", "by": "version", "version": run.version,
                         "at": now_iso(), "step": state.usage.steps}],
                hold=next_hold(self.ledger, self.config, state, job, version=int(version) + 1),
            )
        )  # fmt: skip
        if committed.kind != "ok":
            return False
        try:
            msg = StepMessage(run.tenant, run.run_id, committed.version, run.queue)
            self.send(msg, *time_limits(state, self.config))
        except Exception as exc:  # the pickup lease the commit set has the sweeper send it
            log.warning("version_requeue_unsent", run_id=run.run_id, error=str(exc))
        log.info("version_requeued", run_id=run.run_id, job=run.job, version=run.version)
        return True
