"""What the steps of one worker process share, wired from the worker's Settings: the store's
client, the job registry, the ledger, the run store, where a next step goes and the tool-call
threads; built once in each process."""

from __future__ import annotations

import functools
import multiprocessing
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import redis
import structlog

from turnstile.jobs.errors import StateFormatError
from turnstile.jobs.job import Job
from turnstile.jobs.runtime import READ_POOL_SIZE
from turnstile.jobs.state import RunState
from turnstile.ledger.client import Ledger
from turnstile.ledger.inputs import DEFAULT_DIMENSIONS
from turnstile.providers import retry
from turnstile.worker.broker import producer
from turnstile.worker.broker.message import StepMessage
from turnstile.worker.broker.producer import Send
from turnstile.worker.mcp.toolbox import Toolbox
from turnstile.worker.observability.tracing import Exporter
from turnstile.worker.registry import Jobs, Registry
from turnstile.worker.runtime import pools
from turnstile.worker.runtime.heartbeat import Heartbeat
from turnstile.worker.runtime.pools import Pool
from turnstile.worker.scheduling import fair
from turnstile.worker.scheduling.dispatcher import PublishMany
from turnstile.worker.scheduling.limits import time_limits
from turnstile.worker.scheduling.ratelimits import Buckets
from turnstile.worker.settings import Settings
from turnstile.worker.store.connect import connect
from turnstile.worker.store.records import InFlight
from turnstile.worker.store.runs import Claim, NextStep, RunStore, Started, StoreUnavailable

if TYPE_CHECKING:
    from celery import Celery

log = structlog.get_logger("turnstile.worker")


@dataclass
class Services:
    """What every step of one worker process shares."""

    settings: Settings
    store: RunStore
    ledger: Ledger
    jobs: Jobs
    # Enqueue the next step, with its soft and hard time limits.
    send: Callable[[StepMessage, float, float], None]
    # Renews the in-flight lease of every turn the process runs.
    heartbeat: Heartbeat[InFlight]
    # The next step (with its soft and hard time limits) as the commit that makes it due
    # queues it itself, or None: then `send` sends it after the commit (fair share off, the
    # drills).
    next_step: Callable[[StepMessage, float, float], NextStep | None] = lambda m, s, h: None
    # Or the commit claims it for this worker, to run at once (eager continuation): what it
    # needs to, for the next step, its hard limit and the claimed delivery's token; None: never.
    claim: Callable[[StepMessage, float, str], Claim | None] = lambda msg, hard_s, token: None
    pool: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(READ_POOL_SIZE, "turnstile-tool")
    )  # the process's tool-call threads, shared by its turns
    # The shared buckets of the model endpoints' rate limits (worker/scheduling/ratelimits.py).
    buckets: Buckets | None = None
    # The process's MCP connections (worker/mcp/): a job's tools from its MCP servers.
    mcp: Toolbox = field(default_factory=Toolbox)
    # Where the turns' spans go (TURNSTILE_OTLP_ENDPOINT, from the Settings once); off: nowhere.
    tracing: Exporter = field(default_factory=lambda: Exporter(None))

    def with_mcp(self, job: Job, tenant: str) -> Job:
        """The job as a turn of the tenant's run sees it: with its MCP servers' tools."""
        return self.mcp.job(job, tenant)


def redis_max_connections(config: Settings) -> int:
    """Redis connections one worker process may open to the store: for each turn in flight,
    its own and one per parallel tool call (a tool may read the store), then the heartbeat
    and a few spares."""
    turns = config.concurrency if config.pool == Pool.GEVENT else 1
    return turns * (1 + READ_POOL_SIZE) + pools.SPARE_CONNECTIONS


def build_services(
    config: Settings,
    client: redis.Redis,
    jobs: Registry,
    send_step: Send,
    claiming: Callable[[], bool] = lambda: True,
) -> Services:
    """A worker process's step services, from its Settings, over its store client and its
    job registry; `send_step` publishes through the worker's app; `claiming` says whether the
    worker still takes its runs' next steps itself (not once it is told to stop)."""
    if config.redis_url is None:
        raise StoreUnavailable("no store: set TURNSTILE_REDIS_URL")
    ledger = Ledger(  # over the store's client: one pool, built by worker/store/connect.py
        client, grace_s=config.ledger_grace_s, dimensions=(*DEFAULT_DIMENSIONS, *jobs.dimensions())
    )
    store = RunStore(
        client, ledger, wait_for=config.wait_for, jobs=jobs,
        pickup_lease_ms=int(config.pickup_lease_s * 1000),
    )  # fmt: skip
    route = fair.route(client, config, send_step)

    sends = iter(range(1, 2**62))

    def send(msg: StepMessage, soft_s: float, hard_s: float) -> None:
        if config.chaos_drop_every and next(sends) % config.chaos_drop_every == 0:
            log.warning("chaos_send_dropped", version=msg.version)
            return
        try:
            route(msg, soft_s, hard_s)
            for _ in range(config.chaos_send_copies - 1):  # the drill's duplicates, as they
                send_step(msg, soft_s, hard_s)  # come: past the pending list, which folds them
        except Exception as exc:  # the lease the commit set makes the sweeper send it later
            log.warning("enqueue_failed", error=str(exc), version=msg.version)

    # With fair share on, a run's next step is queued by the commit itself
    # (worker/scheduling/fair.py, run_commit.lua); not in the drills, which stand in the gap
    # between a commit and its send. With a durability wait, a worker may take the step while
    # the commit's wait is under way (milliseconds): a crash then loses that turn with the
    # commit it followed, and it runs again from the durable version, its writes replayed by
    # their keys, as a turn killed mid-flight does.
    queues_in_commit = (
        config.fair_share and not config.chaos_drop_every and config.chaos_send_copies == 1
    )

    def next_step(msg: StepMessage, soft_s: float, hard_s: float) -> fair.Pending | None:
        if not queues_in_commit:
            return None
        return fair.pending_entry(msg, soft_s, hard_s)

    # Eager continuation (TURNSTILE_EAGER_TURNS) rides on the commit that queues the next step,
    # so it needs fair share's queueing in the commit: with fair share off there is no one
    # place that knows whether another tenant waits.
    eager = queues_in_commit and config.eager_turns > 0

    def claim(msg: StepMessage, hard_s: float, token: str) -> Claim | None:
        return fair.claim(msg, hard_s, config, token) if eager and claiming() else None

    # A 429 met by any turn of this process empties the endpoint's bucket for the fleet.
    buckets = Buckets(client)
    retry.on_rate_limited(buckets.block)

    def send_started(started: Started) -> None:
        """A conversation's waiting run that a commit started: its first step, now (the lease
        the commit gave it makes the sweeper send it otherwise)."""
        try:
            state = RunState.from_json(started.state)
        except StateFormatError as exc:  # the sweeper's step fails it, with the reason
            log.warning("started_state_unreadable", run_id=started.run_id, error=str(exc))
            return
        send(StepMessage(started.tenant, started.run_id, 1, started.queue),
             *time_limits(state, config))  # fmt: skip

    store.on_started = send_started
    turns = config.concurrency if config.pool == Pool.GEVENT else 1
    return Services(
        settings=config,
        store=store,
        ledger=ledger,
        jobs=jobs,
        send=send,
        next_step=next_step,
        claim=claim,
        heartbeat=Heartbeat(config.inflight_lease_s / 3, store.renew_all),
        # Tool calls of every turn in flight: greenlets on a green worker, so one set per turn.
        pool=ThreadPoolExecutor(READ_POOL_SIZE * turns, "turnstile-tool"),
        buckets=buckets,
        mcp=Toolbox.from_settings(config),
        tracing=Exporter(config.otlp_endpoint),
    )


@dataclass
class _Process:
    """What one process of the worker built: its store client, its job registry (once per
    process), and its step services once a step asks for them."""

    pid: int
    client: redis.Redis | None
    jobs: Registry
    services: Services | None = None


class WorkerServices:
    """One worker's services: its Settings, the sends through its app, and each process's
    store client, job registry and step services, built in that process on first use, after
    any fork (connections are never shared between processes). The step task and the hooks
    are handed this object when the worker starts; a prefork pool process inherits it with
    the task."""

    def __init__(self, config: Settings, app: Celery) -> None:
        self.settings = config
        self.send: Send = functools.partial(producer.send_step, app)
        self.send_many: PublishMany = functools.partial(producer.send_steps, app)
        self._lock = threading.Lock()
        self._process: _Process | None = None
        # Set when the worker is told to stop (hooks.StopClaimingHook, in the main process),
        # read by its pool processes, which share it (made before they fork): a turn in
        # flight then queues its run's next step instead of claiming it, so a warm shutdown
        # waits for one turn, not a chain.
        self._stopping = multiprocessing.RawValue("b", 0)

    def stop_claiming(self) -> None:
        self._stopping.value = 1

    def claiming(self) -> bool:
        return not self._stopping.value

    def _here(self) -> _Process:
        """This process's part (the caller holds the lock)."""
        pid = os.getpid()
        if self._process is None or self._process.pid != pid:
            config = self.settings
            client = None
            if config.redis_url is not None:
                bound = redis_max_connections(config)
                client = connect(config.redis_url, config, max_connections=bound)
            self._process = _Process(pid, client, Registry.from_settings(config, client))
        return self._process

    def jobs(self) -> Registry:
        """This process's job registry, over its store client (None without a store)."""
        with self._lock:
            return self._here().jobs

    def built(self) -> Services | None:
        """This process's step services if a step (or a hook) has built them, else None."""
        with self._lock:
            here = self._process
            return here.services if here is not None and here.pid == os.getpid() else None

    def services(self) -> Services:
        """This process's step services."""
        with self._lock:
            here = self._here()
            if here.services is None:
                if here.client is None:
                    raise StoreUnavailable("no store: set TURNSTILE_REDIS_URL")
                here.services = build_services(
                    self.settings, here.client, here.jobs, self.send, self.claiming
                )
            return here.services
