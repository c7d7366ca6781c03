"""Job versions in flight, for operators: the live runs of each job and version, the workers
that serve each, and a drain that waits for a version's runs to finish (`turnstile jobs
versions`, the console's Versions page). The runs are read through the status index, a
tenant's slice at a time; each live run's version is its state's (`RunState.job_version`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from turnstile.jobs.errors import StateFormatError
from turnstile.jobs.outcomes import Status
from turnstile.jobs.state import RunState
from turnstile.worker.client._client import Client
from turnstile.worker.ops.errors import ControlError
from turnstile.worker.store import fields, run_index
from turnstile.worker.store import tenants as stored_tenants
from turnstile.worker.store import versions as job_versions
from turnstile.worker.store.values import text

LIVE = (Status.RUNNING.value, Status.SUSPENDED.value, Status.PARKED.value)
DRAIN_POLL_S = 0.5


@dataclass
class VersionView:
    """One version of one job: its live runs by what they do, and the workers serving it."""

    job: str
    version: str
    running: int = 0
    suspended: int = 0
    parked: int = 0  # for a pause or a drain of their queue or tenant
    waiting: int = 0  # parked for a worker of this version: none that took them serves it
    workers: list[str] = field(default_factory=list)

    @property
    def in_flight(self) -> int:
        return self.running + self.suspended + self.parked + self.waiting


def versions(c: Client) -> list[VersionView]:
    """Every job version with live runs or a worker serving it, by job and version."""
    views: dict[tuple[str, str], VersionView] = {}

    def view(job: str, version: str) -> VersionView:
        return views.setdefault((job, version), VersionView(job, version))

    for served in job_versions.live(c.client):
        view(served.job, served.version).workers.append(served.worker)
    for tenant in stored_tenants.names(c.client):
        for status in LIVE:
            for ids in run_index.in_status(c.client, tenant, status):
                rows = run_index.fields_of_runs(
                    c.client, [(tenant, r) for r in ids], fields.STATE, fields.REASON
                )
                for state_json, reason in rows:
                    _count(view, status, text(state_json), text(reason))
    return [views[k] for k in sorted(views)]


def _count(
    view: Callable[[str, str], VersionView], status: str, state_json: str, reason: str
) -> None:
    try:
        state = RunState.from_json(state_json)
    except StateFormatError:
        return
    row = view(state.job, state.job_version or "?")
    if status == Status.RUNNING.value:
        row.running += 1
    elif status == Status.SUSPENDED.value:
        row.suspended += 1
    elif reason.startswith(job_versions.WAITING_FOR_VERSION):
        row.waiting += 1
    else:
        row.parked += 1


def in_flight(c: Client, job: str, version: str) -> int:
    """The live runs of that version of that job."""
    return sum(v.in_flight for v in versions(c) if v.job == job and v.version == version)


def wait_drained(c: Client, job: str, version: str, *, timeout_s: float | None = None) -> int:
    """Wait until no live run of that version of that job is left (0), or `timeout_s` has
    passed: ControlError saying how many are left. New runs start on the version the
    submitting service's job has, so a version no service submits to only ever drains."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        left = in_flight(c, job, version)
        if left == 0:
            return 0
        if deadline is not None and time.monotonic() >= deadline:
            raise ControlError(
                f"job {job!r} version {version!r} still has {left} live run(s) after "
                f"{timeout_s:g} s"
            )
        time.sleep(DRAIN_POLL_S)
