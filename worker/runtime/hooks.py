"""The worker's hooks: its signal wiring as named objects, one concern each, connected by
`install` when a worker starts (worker/runtime/app.py), never on import."""

from __future__ import annotations

import contextlib
import gc
import os
import socket
import threading
from collections.abc import Callable, Sequence
from typing import Any

import redis
import structlog
from celery import signals

from turnstile.errors import StoreMismatchError, StoreUnavailableError
from turnstile.ledger.client import Ledger
from turnstile.worker.broker import layout, producer
from turnstile.worker.mcp.toolbox import McpConfigError, load_secrets
from turnstile.worker.observability import metrics
from turnstile.worker.observability.logs import configure as configure_logging
from turnstile.worker.registry import Registry
from turnstile.worker.runtime import pools, reach
from turnstile.worker.runtime.services import WorkerServices
from turnstile.worker.scheduling import dispatcher as fair_dispatcher
from turnstile.worker.scheduling import fair
from turnstile.worker.scheduling.sweeper import Sweeper
from turnstile.worker.scheduling.versions import Requeuer
from turnstile.worker.settings import Settings
from turnstile.worker.store import queues as served_queues
from turnstile.worker.store import versions as job_versions
from turnstile.worker.store.connect import UNAVAILABLE, connect, quiet_redis_hooks
from turnstile.worker.store.connect import check as store_check
from turnstile.worker.store.durability import DurabilityRefusedError, check_server
from turnstile.worker.store.runs import RunStore
from turnstile.worker.store.values import server_ms

log = structlog.get_logger("turnstile.worker")


class Hook:
    """One concern of a worker's life, told of the Celery signals it answers, as dramatiq's
    middleware is told of its broker's events: a method named after a signal answers it; the
    ones a hook does not override are not connected. Each method runs in the process the
    signal fires in: the main process (worker_init, worker_ready, worker_shutting_down,
    worker_shutdown) or a pool process (worker_process_init, worker_process_shutdown)."""

    def worker_init(self, **kwargs: Any) -> None:
        """The main process, before the pool starts (a prefork pool forks after it)."""

    def worker_ready(self, sender: Any = None, **kwargs: Any) -> None:
        """The main process, its consumer ready (`sender`) and its pool started."""

    def worker_shutting_down(self, **kwargs: Any) -> None:
        """The main process, told to stop (`exitcode`: the status the signal announced)."""

    def worker_shutdown(self, **kwargs: Any) -> None:
        """The main process, stopping."""

    def worker_process_init(self, **kwargs: Any) -> None:
        """A pool process, just started."""

    def worker_process_shutdown(self, **kwargs: Any) -> None:
        """A pool process, stopping (`pid`)."""


SIGNALS = ("worker_init", "worker_ready", "worker_shutting_down", "worker_shutdown",
           "worker_process_init", "worker_process_shutdown")  # fmt: skip


def install(hooks: Sequence[Hook]) -> None:
    """Connect each hook's methods to their signals, in the hooks' order (weak=False: a hook
    lives as long as its worker)."""
    for hook in hooks:
        for name in SIGNALS:
            if getattr(type(hook), name) is not getattr(Hook, name):
                getattr(signals, name).connect(getattr(hook, name), weak=False)


class LoggingHook(Hook):
    """Structured logs in the main process and in every pool process, and the line a worker
    says it is ready with (the tests and an operator wait for `worker_ready`)."""

    def __init__(self, config: Settings) -> None:
        self.config = config

    def worker_init(self, **kwargs: Any) -> None:
        configure_logging(self.config.log_format, self.config.log_level)

    def worker_process_init(self, **kwargs: Any) -> None:
        configure_logging(self.config.log_format, self.config.log_level)

    def worker_ready(self, sender: Any = None, **kwargs: Any) -> None:
        log.info("worker_ready", hostname=getattr(sender, "hostname", ""), pid=os.getpid())


class RedisHooksHook(Hook):
    """redis-py's metric hooks made to do nothing in the worker's processes when its
    OpenTelemetry metrics are off (worker/store/connect.py `quiet_redis_hooks`), before the
    pool forks, so every redis-py client of the worker's processes gains."""

    def worker_init(self, **kwargs: Any) -> None:
        quiet_redis_hooks()


# The cyclic collector's thresholds in a worker (see GcHook): a young collection after this many
# more allocations than frees of container objects (Python's default: 700), an older one after
# 20 young ones (10), a full one after 10 older ones (10, and only once the objects that became
# old since the last full one are a quarter of those it kept).
GC_THRESHOLDS = (50_000, 20, 10)


class GcHook(Hook):
    """The cyclic garbage collector made to run about seventy times less often in a worker, and
    the objects its start-up made (modules, the app, the jobs, the clients) set aside from it
    (`gc.freeze`), in the main process before the pool forks, again once it is ready, and in
    each pool process once started.

    With Python's default thresholds a green worker with a thousand turns in flight collected
    about 2,000 times in a 20 s run, 17 of them over its whole heap, and spent 6.4-8.4 s doing
    so: a third of its CPU (tests/bench/bench_latency.py, 2,000 runs). A turn's own garbage is
    mostly freed by reference counting; what a cycle keeps waits for the next young collection,
    after at most 50,000 allocations. Frozen objects are never scanned, and a prefork pool
    process no longer writes to the pages it shares with its parent when it collects."""

    def worker_init(self, **kwargs: Any) -> None:
        gc.set_threshold(*GC_THRESHOLDS)
        gc.freeze()

    def worker_ready(self, sender: Any = None, **kwargs: Any) -> None:
        gc.freeze()
        log.info("gc_tuned", thresholds=list(gc.get_threshold()), frozen=gc.get_freeze_count())

    def worker_process_init(self, **kwargs: Any) -> None:
        gc.freeze()


class DurabilityHook(Hook):
    """A worker whose store cannot keep TURNSTILE_DURABILITY's promise, or whose store URL
    and server disagree (see worker/store/connect.py `check`), does not start: one line, and
    an exit status its supervisor sees (SystemExit passes Celery's signal dispatch, which
    swallows exceptions)."""

    def __init__(self, config: Settings) -> None:
        self.config = config

    def worker_init(self, **kwargs: Any) -> None:
        config = self.config
        if config.redis_url is None:
            return
        try:
            client = connect(config.redis_url, config)
        except StoreMismatchError as exc:  # a cluster URL and a server that is none, say
            raise SystemExit(f"error: {exc}") from None
        except StoreUnavailableError:  # down for now: the steps retry until it is back
            return
        try:
            # The URL and the server agree (a cluster for a cluster URL), and the broker is
            # not the cluster.
            with contextlib.suppress(*UNAVAILABLE):
                store_check(client, config.redis_url, config)
            _ = config.broker
            if config.wait_for.waits:
                check_server(client, config.wait_for)
        except (DurabilityRefusedError, StoreMismatchError) as exc:
            raise SystemExit(f"error: {exc}") from None
        finally:
            client.close()


class ReachHook(Hook):
    """A worker whose store or broker does not answer within TURNSTILE_START_WAIT_S, or
    refuses it (a wrong password, a RabbitMQ vhost that is not there), does not start: one line
    naming it and what to do, and an exit status, before Celery's consumer would retry for
    ever or print a traceback (worker/runtime/reach.py). A store lost later is ridden out."""

    def __init__(self, config: Settings) -> None:
        self.config = config

    def worker_init(self, **kwargs: Any) -> None:
        if self.config.redis_url is None:
            return
        found = reach.wait_reachable(self.config)
        if found is not None:
            raise SystemExit(f"error: {found.line(self.config.start_wait_s)}")


class SweeperHook(Hook):
    """The sweeper: a thread in each worker's main process that sends again the steps whose
    leases lapsed (worker/scheduling/sweeper.py)."""

    def __init__(self, config: Settings, send: producer.Send) -> None:
        self.config, self.send = config, send
        self.stop = threading.Event()

    def worker_ready(self, sender: Any = None, **kwargs: Any) -> None:
        config = self.config
        if config.redis_url is None:
            return
        self.stop.clear()

        def sweep(client: redis.Redis) -> None:
            Sweeper(client, config, fair.route(client, config, self.send)).loop(self.stop)

        _with_store(config, self.stop, "turnstile-sweeper", sweep)

    def worker_shutdown(self, **kwargs: Any) -> None:
        self.stop.set()


# How much longer than its own poll a stopping worker waits for its dispatcher thread.
SHUTDOWN_JOIN_S = 1.0


class DispatcherHook(Hook):
    """With fair share, the dispatcher: a thread in each worker's main process that moves
    steps from the tenants' pending lists to the broker (worker/scheduling/dispatcher.py)."""

    def __init__(self, config: Settings, send_many: fair_dispatcher.PublishMany) -> None:
        self.config, self.send_many = config, send_many
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None

    def worker_ready(self, sender: Any = None, **kwargs: Any) -> None:
        config = self.config
        if config.redis_url is None or not config.fair_share:
            return
        depth = layout.depth_reader(config.broker, lambda url: connect(url, config))
        capacity = _capacity(sender)
        self.stop.clear()

        def dispatch(client: redis.Redis) -> None:
            dispatcher = fair_dispatcher.Dispatcher(client, depth, config, self.send_many)
            dispatcher.capacity = capacity
            dispatcher.loop(self.stop)

        self.thread = _with_store(config, self.stop, "turnstile-dispatcher", dispatch)

    def worker_shutdown(self, **kwargs: Any) -> None:
        """Stop, and wait for the dispatcher to give its lock up (its wait for a nudge ends
        within `dispatch_poll_s`)."""
        self.stop.set()
        if self.thread is not None:
            self.thread.join(self.config.dispatch_poll_s + SHUTDOWN_JOIN_S)


def _with_store(
    config: Settings, stop: threading.Event, name: str, run: Callable[[redis.Redis], None]
) -> threading.Thread:
    """`run` on a thread of its own with a client of the store, made there: a cluster's client
    reads the slot map when it is made, so a cluster that is down as the worker starts is
    waited for (a single server's client connects at its first command)."""

    def target() -> None:
        while not stop.is_set():
            try:
                client = connect(str(config.redis_url), config)
            except StoreUnavailableError as exc:
                log.warning("store_unavailable", thread=name, error=str(exc))
                stop.wait(config.dispatch_poll_s)
                continue
            run(client)
            return

    thread = threading.Thread(target=target, name=name, daemon=True)
    thread.start()
    return thread


def _queues(consumer: Any) -> list[str]:
    """The Turnstile queues the worker reads (Celery knows them by their broker names)."""
    return sorted({layout.turnstile_queue(str(q)) for q in consumer.app.amqp.queues.consume_from})


def _capacity(consumer: Any) -> tuple[str, list[str], int] | None:
    """This worker as the dispatcher announces it: its name, the queues it reads and how many
    turns it holds in flight (the pool's limit: processes on prefork, greenlets on gevent)."""
    try:
        return str(consumer.hostname), _queues(consumer), int(consumer.pool.limit)
    except (AttributeError, TypeError, ValueError) as exc:
        log.warning("capacity_unknown", error=str(exc))
        return None


class ServedQueuesHook(Hook):
    """As the worker gets ready, before its ready line: the queues it reads are registered as
    served in the store, so clients may submit to them from then on (worker/store/queues.py).
    A store that does not answer now is tried again from a thread until it does."""

    def __init__(self, config: Settings) -> None:
        self.config = config
        self.stop = threading.Event()

    def worker_ready(self, sender: Any = None, **kwargs: Any) -> None:
        try:
            queues = _queues(sender)
        except (AttributeError, TypeError) as exc:
            log.warning("served_queues_unknown", error=str(exc))
            return
        if self.config.redis_url is None or not queues:
            return
        self.stop.clear()
        try:
            client = connect(self.config.redis_url, self.config)
            try:
                served_queues.register_served(client, queues, server_ms(client))
            finally:
                client.close()
        except (StoreUnavailableError, redis.RedisError) as exc:
            log.warning("served_queues_unregistered", error=str(exc))
            _with_store(self.config, self.stop, "turnstile-served-queues", self._retry(queues))

    def _retry(self, queues: list[str]) -> Callable[[redis.Redis], None]:
        def register(client: redis.Redis) -> None:
            while not self.stop.wait(self.config.dispatch_poll_s):
                try:
                    served_queues.register_served(client, queues, server_ms(client))
                    log.info("served_queues_registered", queues=queues)
                    return
                except redis.RedisError:  # still down: try again shortly
                    continue

        return register

    def worker_shutdown(self, **kwargs: Any) -> None:
        self.stop.set()


class WatchdogHook(Hook):
    """On a green worker, once it is up (its imports done): kill it if its hub blocks
    (worker/runtime/pools.py)."""

    def __init__(self, config: Settings) -> None:
        self.config = config

    def worker_ready(self, sender: Any = None, **kwargs: Any) -> None:
        if pools.green():
            pools.Watchdog(self.config.hub_block_limit_s, on_kill=_hub_blocked).start()


def _hub_blocked(blocked_s: float) -> None:
    """The watchdog's last line, written from its OS thread without taking any lock."""
    line = f'{{"event": "hub_blocked", "blocked_s": {blocked_s:.1f}, "pid": {os.getpid()}}}\n'
    os.write(2, line.encode())


class JobsLogHook(Hook):
    """Once per worker: the jobs it can run, and one line for each plugin that is broken."""

    def __init__(self, jobs: Callable[[], Registry]) -> None:
        self.jobs = jobs

    def worker_ready(self, sender: Any = None, **kwargs: Any) -> None:
        registry = self.jobs()
        registry.log_broken()
        log.info("worker_jobs", jobs=registry.names(), dimensions=list(registry.dimensions()))


class McpHook(Hook):
    """The MCP servers of the worker's jobs (worker/mcp/): a secrets file that cannot be read
    stops the worker as it starts, in one line; each process that runs steps connects its
    jobs' servers and lists their tools when it starts, on a thread of its own, saying once
    what is wrong (its first step does not wait for them); and stops its stdio servers as
    it stops."""

    def __init__(self, worker: WorkerServices) -> None:
        self.worker = worker

    def worker_init(self, **kwargs: Any) -> None:
        try:
            load_secrets(self.worker.settings.mcp_secrets_file)
        except McpConfigError as exc:
            raise SystemExit(f"error: {exc}") from None

    def worker_process_init(self, **kwargs: Any) -> None:
        self._warm()

    def worker_ready(self, sender: Any = None, **kwargs: Any) -> None:
        if pools.green():  # its one process runs the steps (prefork's children warm their own)
            self._warm()

    def worker_process_shutdown(self, **kwargs: Any) -> None:
        self._close()

    def worker_shutdown(self, **kwargs: Any) -> None:
        if pools.green():
            self._close()

    def _warm(self) -> None:
        def warm() -> None:
            try:
                registry = self.worker.jobs()
                jobs = [registry.get(name) for name in registry.names()]
                if any(job.mcp for job in jobs):
                    self.worker.services().mcp.warm(jobs)
            except Exception as exc:  # a store that is down: the first step connects instead
                log.warning("mcp_warm_failed", error=str(exc))

        threading.Thread(target=warm, name="turnstile-mcp-warm", daemon=True).start()

    def _close(self) -> None:
        built = self.worker.built()
        if built is not None:
            built.mcp.close()


class MetricsHook(Hook):
    """Prometheus metrics: written by every pool process, served by the main process."""

    def __init__(self, config: Settings) -> None:
        self.config = config

    def worker_init(self, **kwargs: Any) -> None:
        metrics.enable(self.config.metrics_port)  # before the pool forks: the children inherit it

    def worker_ready(self, sender: Any = None, **kwargs: Any) -> None:
        metrics.serve(self.config.metrics_port)

    def worker_process_shutdown(self, pid: int | None = None, **kwargs: Any) -> None:
        metrics.process_dead(pid or os.getpid())


def claims(registry: Registry) -> list[tuple[str, str, str]]:
    """(job, version, fingerprint) of every job this worker can run."""
    jobs = (registry.get(name) for name in registry.names())
    return [(job.name, job.version, job.fingerprint) for job in jobs]


FULL_PASS_EVERY = 12  # a minute with the default TTL


class VersionsHook(Hook):
    """The job versions this worker serves, claimed in the store as it starts (a version a live
    worker serves under another definition stops it, in one line), renewed on a heartbeat of
    a third of TURNSTILE_VERSION_TTL_S that also takes back the runs waiting for one of them
    (scheduling/versions.py), and given up as it stops (worker/store/versions.py)."""

    def __init__(self, worker: WorkerServices) -> None:
        self.worker = worker
        self.config = worker.settings
        self.stop = threading.Event()
        self.name = f"{socket.gethostname()}.{os.getpid()}"
        self.claimed: list[tuple[str, str, str]] = []

    @property
    def ttl_ms(self) -> int:
        return int(self.config.version_ttl_s * 1000)

    def worker_init(self, **kwargs: Any) -> None:
        if self.config.redis_url is None:
            return
        self.name = f"{socket.gethostname()}.{os.getpid()}"
        self.claimed = claims(self.worker.jobs())
        try:
            client = connect(self.config.redis_url, self.config)
            try:
                refusal = job_versions.claim(client, self.name, self.claimed, self.ttl_ms)
            finally:
                client.close()
        except Exception as exc:  # the store is down: the heartbeat claims them when it is back
            log.warning("versions_unclaimed", error=str(exc))
            return
        if refusal is not None:
            raise SystemExit(f"error: {refusal}")
        log.info("versions_claimed", worker=self.name,
                 versions=[f"{j}@{v}" for j, v, _ in self.claimed])  # fmt: skip

    def worker_ready(self, sender: Any = None, **kwargs: Any) -> None:
        if self.config.redis_url is None:
            return
        self.stop.clear()
        _with_store(self.config, self.stop, "turnstile-versions", self._beat)

    def _beat(self, client: redis.Redis) -> None:
        config, registry = self.config, self.worker.jobs()
        requeuer = Requeuer(
            RunStore(client, Ledger(client, grace_s=config.ledger_grace_s)),
            Ledger(client, grace_s=config.ledger_grace_s), config,
            fair.route(client, config, self.worker.send), registry.get,
        )  # fmt: skip
        served = {(job, version) for job, version, _ in self.claimed}
        beats = 0
        while True:
            try:
                job_versions.renew(client, self.name, self.claimed, self.ttl_ms)
                # Every FULL_PASS_EVERY beats, every parked run: a mark lost to a kill between
                # a park and its mark is found there.
                requeuer.requeue_served(served, full=beats % FULL_PASS_EVERY == 0)
                beats += 1
            except Exception as exc:  # the store may be down: the next beat tries again
                log.warning("versions_heartbeat_failed", error=str(exc))
            if self.stop.wait(self.config.version_ttl_s / 3):
                break
        with contextlib.suppress(Exception):
            job_versions.release(client, self.name, self.claimed)

    def worker_shutdown(self, **kwargs: Any) -> None:
        self.stop.set()
        if self.config.redis_url is None or not self.claimed:
            return
        with contextlib.suppress(Exception):  # a killed worker's claims lapse with their TTL
            client = connect(self.config.redis_url, self.config)
            try:
                job_versions.release(client, self.name, self.claimed)
            finally:
                client.close()


class ExitCodeHook(Hook):
    """The exit status a shutdown signal announced (1 for a cold shutdown). Celery's worker
    exits 0 after a cold shutdown all the same (WorkController.terminate keeps no exit code),
    so `turnstile worker` exits with this one when Celery's own is 0."""

    def __init__(self) -> None:
        self.announced: list[int] = []

    def worker_shutting_down(self, exitcode: int | None = None, **kwargs: Any) -> None:
        if exitcode:
            self.announced.append(int(exitcode))

    def exitcode(self) -> int:
        return max(self.announced, default=0)


class StopClaimingHook(Hook):
    """Told to stop, the worker claims no more of its runs' next steps (eager continuation):
    each turn in flight queues its run's next step, and the warm shutdown waits for it alone."""

    def __init__(self, worker: WorkerServices) -> None:
        self.worker = worker

    def worker_shutting_down(self, **kwargs: Any) -> None:
        self.worker.stop_claiming()


def worker_hooks(worker: WorkerServices) -> list[Hook]:
    """The worker's hooks, in the order they answer a signal: logging configured first (at
    worker_init), so every other hook's lines are structured; the queues registered as
    served, then the ready line, then the threads start."""
    config = worker.settings
    return [
        ServedQueuesHook(config),  # its queues open to clients before the ready line says so
        LoggingHook(config),
        RedisHooksHook(),
        ReachHook(config),
        DurabilityHook(config),
        SweeperHook(config, worker.send),
        DispatcherHook(config, worker.send_many),
        WatchdogHook(config),
        JobsLogHook(worker.jobs),
        McpHook(worker),
        MetricsHook(config),
        StopClaimingHook(worker),
        VersionsHook(worker),
        ExitCodeHook(),
        GcHook(),  # last: what every other hook made at start-up is set aside with the rest
    ]
