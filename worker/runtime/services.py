"""What the steps of one worker process share, wired from the worker's Settings: the store's
client, the job registry, the ledger, the run store, where a next step goes and the tool-call
threads; built once in each process."""

from __future__ import annotations

import functools
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import structlog

from turnstile.jobs.kernel import READ_POOL_SIZE
from turnstile.ledger.client import Ledger
from turnstile.ledger.inputs import DEFAULT_DIMENSIONS
from turnstile.worker.broker import producer
from turnstile.worker.broker.message import StepMessage
from turnstile.worker.broker.producer import Send
from turnstile.worker.registry import Jobs
from turnstile.worker.runtime import pools
from turnstile.worker.runtime.limits import time_limits
from turnstile.worker.runtime.pools import Pool
from turnstile.worker.runtime.step import Heartbeat, Services
from turnstile.worker.scheduling import fair
from turnstile.worker.settings import Settings
from turnstile.worker.store.connect import connect
from turnstile.worker.store.runs import RunStore, StoreUnavailable

if TYPE_CHECKING:
    from celery import Celery

log = structlog.get_logger("turnstile.worker")


def redis_max_connections(config: Settings) -> int:
    """Redis connections one worker process may open to the store: for each turn in flight,
    its own and one per parallel tool call (a tool may read the store), then the heartbeat
    and a few spares."""
    turns = config.concurrency if config.pool == Pool.GEVENT else 1
    return turns * (1 + READ_POOL_SIZE) + pools.SPARE_CONNECTIONS


def build_services(config: Settings, send_step: Send) -> Services:
    """A worker process's step services, from its Settings; `send_step` publishes through
    the worker's app."""
    if config.redis_url is None:
        raise StoreUnavailable("no store: set TURNSTILE_REDIS_URL")
    client = connect(config.redis_url, config, max_connections=redis_max_connections(config))
    jobs = Jobs(client, drills=config.allow_drills)
    ledger = Ledger.from_url(
        config.redis_url, grace_s=config.ledger_grace_s,
        dimensions=(*DEFAULT_DIMENSIONS, *jobs.dimensions()),
    )  # fmt: skip
    store = RunStore(client, ledger, wait_for=config.wait_for)
    route = fair.route(client, config, send_step)

    sends = iter(range(1, 2**62))

    def send(msg: StepMessage, state: Any) -> None:
        soft_s, hard_s = time_limits(state, config)
        if config.chaos_drop_every and next(sends) % config.chaos_drop_every == 0:
            log.warning("chaos_send_dropped", version=msg.version)
            return
        try:
            route(msg, soft_s, hard_s)
            for _ in range(config.chaos_send_copies - 1):  # the drill's duplicates, as they
                send_step(msg, soft_s, hard_s)  # come: past the pending list, which folds them
        except Exception as exc:  # the lease the commit set makes the sweeper send it later
            log.warning("enqueue_failed", error=str(exc), version=msg.version)

    # With fair share on, a run's next step is queued by the commit itself (worker/fair.py,
    # run_commit.lua); not in the drills, which stand in the gap between a commit and its
    # send. With a durability wait, a worker may take the step while the commit's wait is
    # under way (milliseconds): a crash then loses that turn with the commit it followed, and
    # it runs again from the durable version, its writes replayed by their keys, as a turn
    # killed mid-flight does.
    queues_in_commit = (
        config.fair_share and not config.chaos_drop_every and config.chaos_send_copies == 1
    )

    def next_step(msg: StepMessage, state: Any) -> fair.Pending | None:
        if not queues_in_commit:
            return None
        return fair.pending_entry(msg, *time_limits(state, config))

    turns = config.concurrency if config.pool == Pool.GEVENT else 1
    return Services(
        settings=config,
        store=store,
        ledger=ledger,
        jobs=jobs,
        send=send,
        next_step=next_step,
        heartbeat=Heartbeat(config.inflight_lease_s / 3),
        # Tool calls of every turn in flight: greenlets on a green worker, so one set per turn.
        pool=ThreadPoolExecutor(READ_POOL_SIZE * turns, "turnstile-tool"),
    )


class WorkerServices:
    """One worker's services: its Settings, the sends through its app, and each process's
    step services, built in that process on first use, after any fork (connections are never
    shared between processes). The step task and the hooks are handed this object when the
    worker starts; a prefork pool process inherits it with the task."""

    def __init__(self, config: Settings, app: Celery) -> None:
        self.settings = config
        self.send: Send = functools.partial(producer.send_step, app)
        self.send_many: fair.PublishMany = functools.partial(producer.send_steps, app)
        self._lock = threading.Lock()
        self._built: dict[int, Services] = {}

    def services(self) -> Services:
        """This process's services."""
        pid = os.getpid()
        with self._lock:
            if pid not in self._built:
                self._built.clear()
                self._built[pid] = build_services(self.settings, self.send)
            return self._built[pid]
