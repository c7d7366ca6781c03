"""What an operator's control applies to, a queue or a tenant (`Subject`), and what the store
holds for it: the tenants, the parked runs, the turns in flight. The flags, the queue views
and the listing read the store's indexes through here, a slice at a time.
"""

from __future__ import annotations

from dataclasses import dataclass

from turnstile.jobs.outcomes import Status
from turnstile.worker.client._client import Client
from turnstile.worker.names import check_name
from turnstile.worker.ops.errors import ControlError
from turnstile.worker.store import fields, leases, run_index
from turnstile.worker.store import queues as stored_queues
from turnstile.worker.store import tenants as stored_tenants
from turnstile.worker.store.controls import Target
from turnstile.worker.store.values import server_ms, text


@dataclass(frozen=True)
class Subject:
    """What a control applies to: one queue (across tenants) or one tenant (across queues)."""

    queue: str | None = None
    tenant: str | None = None

    def __post_init__(self) -> None:
        if (self.queue is None) == (self.tenant is None):
            raise ControlError("give exactly one of a queue or a tenant")
        check_name("queue" if self.queue is not None else "tenant", self.queue or self.tenant)

    @property
    def kind(self) -> Target:  # "queue" | "tenant", as Flagged and Resumed name it
        return "queue" if self.queue is not None else "tenant"

    @property
    def name(self) -> str:
        name = self.queue if self.queue is not None else self.tenant
        assert name is not None
        return name


@dataclass(frozen=True)
class StoredQueue(Subject):
    """A queue named by the store rather than by a person (the queue views list every queue
    the store holds, one stored before the name rule refused its name included): not held to
    the name rule."""

    def __post_init__(self) -> None:
        if self.queue is None or self.tenant is not None:
            raise ControlError("a stored queue is a queue")


SCAN_COUNT = 500  # tenants whose turns in flight are read per round trip


def tenants(c: Client) -> list[str]:
    """Every tenant with runs, by name, read in slices (a tenant is far fewer keys than its
    runs; the runs themselves are only ever read a page at a time)."""
    return stored_tenants.names(c.client)


def check_known(c: Client, subject: Subject) -> None:
    if subject.queue is not None and not stored_queues.known(c.client, subject.queue):
        raise ControlError(f"unknown queue {subject.queue!r}")
    if subject.tenant is not None and not stored_tenants.known(c.client, subject.tenant):
        raise ControlError(f"unknown tenant {subject.tenant!r}")


def _tenants_of(c: Client, subject: Subject) -> list[str]:
    """The subject's tenant; for a queue, every tenant (any of them may have runs on it)."""
    return [subject.tenant] if subject.tenant is not None else tenants(c)


def runs_in(c: Client, subject: Subject, status: str) -> list[tuple[str, str, str]]:
    """(tenant, run id, queue) of every run of the subject in `status`; a queue's look across
    tenants."""
    out = set()
    for tenant in _tenants_of(c, subject):
        for ids in run_index.in_status(c.client, tenant, status):
            found = run_index.fields_of_runs(c.client, [(tenant, r) for r in ids], fields.QUEUE)
            for run_id, (queue,) in zip(ids, found, strict=True):
                if subject.queue is None or text(queue) == subject.queue:
                    out.add((tenant, run_id, text(queue)))
    return sorted(out)


def parked_runs(c: Client, subject: Subject) -> list[tuple[str, str, str]]:
    """(tenant, run id, queue) of every parked run of the subject."""
    return runs_in(c, subject, Status.PARKED.value)


def live_inflight(c: Client, subject: Subject) -> list[tuple[str, str, str]]:
    """(tenant, run id, queue) of the subject's turns in flight. An entry counts only while its
    own lease is in the future: a worker that died mid-turn leaves one behind."""
    now = server_ms(c.client)
    out = []
    names = _tenants_of(c, subject)
    for start in range(0, len(names), SCAN_COUNT):  # one round trip per slice of tenants
        for turn in leases.in_flight(c.client, names[start : start + SCAN_COUNT]):
            live = turn.lease_ms is not None and turn.lease_ms > now
            if live and subject.queue in (None, turn.queue):
                out.append((turn.tenant, turn.run_id, turn.queue))
    return out
