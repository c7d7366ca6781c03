"""The sweeper: re-sends the step of every live run whose lease lapsed without a commit.

A lease is set when a run is created or commits (time for its next step to start) and when a
step starts (time for it to commit, renewed by a heartbeat). A worker that died after its
commit and before its enqueue, or whose message was lost, leaves a lapsed lease behind. The
re-sent step carries the run's current version, so if the original turns up after all, one of
the two finds the version moved on and does nothing. It also runs the ledger's reaper, which
charges reservations past their deadline.

It re-sends a version once and then waits: a step it sent that no delivery has loaded since is
still waiting on the broker (a queue no worker reads, a long backlog), and sending it again
would only pile up copies. A delivery that loaded it and died is seen by its load (the run's
`loaded_ms` is after the send), so that step is sent again; a message lost after a worker
fetched it and before it loaded is taken back by the broker after its visibility timeout, and
past that timeout the sweeper sends the step once more. With fair share on, the sweeper knows
more: a step still in its tenant's pending list, or dispatched and holding a live slot, is
waiting; one that is neither, and that no delivery loaded, was lost after its dispatch (a
worker killed after fetching it, say), and it is sent again at once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import redis
import structlog

from turnstile.jobs.errors import StateFormatError
from turnstile.jobs.outcomes import Status
from turnstile.jobs.state import RunState
from turnstile.ledger.client import Ledger
from turnstile.worker.broker.message import StepMessage
from turnstile.worker.scheduling import retention
from turnstile.worker.scheduling.limits import time_limits
from turnstile.worker.settings import Settings
from turnstile.worker.store import fields, leases, locks, pending, run_index, tenants
from turnstile.worker.store.values import server_ms

log = structlog.get_logger("turnstile.sweeper")

BATCH = 200  # lapsed leases handled per tenant per sweep


class Sweeper:
    def __init__(
        self,
        client: redis.Redis,
        config: Settings,
        send: Callable[[StepMessage, float, float], None],
        ledger: Ledger | None = None,
    ) -> None:
        self.client, self.config, self.send = client, config, send
        self.ledger = ledger or Ledger(client, grace_s=config.ledger_grace_s)

    def sweep(self) -> int:
        """One pass over every tenant; returns how many steps were re-sent. One worker sweeps
        at a time: the others find the lock taken and skip the pass."""
        interval_ms = int(self.config.sweep_interval_s * 1000)
        if not locks.once_per(self.client, locks.SWEEPER, max(100, interval_ms - 50)):
            return 0
        self.ledger.reap_all()
        now = server_ms(self.client)
        sent = 0
        for tenant in tenants.names(self.client):
            for run_id in leases.lapsed(self.client, tenant, now, BATCH):
                sent += self._resend(tenant, run_id, now)
        return sent

    def _resend(self, tenant: str, run_id: str, now: int) -> int:
        version, status, queue, state_json, resent, loaded_ms = run_index.fields_of(
            self.client, tenant, run_id, fields.VERSION, fields.STATUS, fields.QUEUE,
            fields.STATE, fields.RESENT, fields.LOADED_MS,
        )  # fmt: skip
        if status != Status.RUNNING.value or version is None:
            leases.drop(self.client, tenant, run_id)  # a lease of a run that is not live
            return 0
        # The next lapse is a whole pickup lease away, so one sweep sends one step, not many.
        leases.push_back(self.client, tenant, run_id,
                         now + int(self.config.pickup_lease_s * 1000))  # fmt: skip
        if self._waiting(
            tenant, run_id, version=str(version), resent=str(resent or ""),
            loaded_ms=int(str(loaded_ms or 0)), now=now,
        ):  # fmt: skip
            log.info("step_waiting", tenant=tenant, run_id=run_id, version=int(str(version)))
            return 0
        try:
            soft_s, hard_s = time_limits(RunState.from_json(str(state_json)), self.config)
        except StateFormatError:
            soft_s, hard_s = time_limits_default(self.config)
        self.send(StepMessage(tenant, run_id, int(str(version)), str(queue)), soft_s, hard_s)
        run_index.mark_resent(self.client, tenant, run_id, str(version), now)
        log.info("step_resent", tenant=tenant, run_id=run_id, version=int(str(version)))
        return 1

    def _waiting(
        self, tenant: str, run_id: str, *, version: str, resent: str, loaded_ms: int, now: int
    ) -> bool:
        queued = None
        if self.config.fair_share and resent.startswith(f"{version}|"):
            queued = pending.step_queued(self.client, tenant, run_id, version, now)
        return still_waiting(
            version=version, resent=resent, loaded_ms=loaded_ms, now_ms=now,
            patience_ms=self.config.visibility_timeout_s * 1000, queued=queued,
        )  # fmt: skip

    def loop(self, stop: threading.Event) -> None:
        while not stop.wait(self.config.sweep_interval_s):
            try:
                self.sweep()
                retention.run_due(self.client, self.config, self.ledger)  # old runs, periods
            except Exception as exc:  # the store may be down: try again next interval
                log.warning("sweep_failed", error=str(exc))


def still_waiting(
    *,
    version: str,
    resent: str,
    loaded_ms: int,
    now_ms: int,
    patience_ms: int,
    queued: bool | None = None,
) -> bool:
    """Whether the step the sweeper last sent for `version` ("<version>|<sent ms>" in
    `resent`) is still waiting: no delivery has loaded the run since it was sent (`loaded_ms`),
    and either fair share says it is `queued` (pending, or dispatched with a live slot), or,
    where nothing says so (None: fair share off), the broker has not yet given up on a message
    a worker fetched and lost (its visibility timeout, `patience_ms`)."""
    sent_version, _, sent_ms = resent.partition("|")
    if sent_version != version or not sent_ms.isdigit() or loaded_ms >= int(sent_ms):
        return False
    if queued is not None:
        return queued
    return now_ms - int(sent_ms) < patience_ms


def time_limits_default(config: Settings) -> tuple[float, float]:
    hard = config.max_deadline_s + config.step_grace_s
    return hard - config.soft_margin_s, hard
