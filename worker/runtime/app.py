"""A worker process's Celery app, built when the worker starts: the app's configuration
(worker/broker/app.py, shared with the client's private producer) with the bound on broker
connections the worker's pool needs, and the step task, services and hooks.

Nothing is built on import. `build_worker(config)` builds the worker from a Settings value:
its app, the step task registered on it (worker/runtime/task.py), its services
(worker/runtime/services.py) and its hooks, connected (worker/runtime/hooks.py). `turnstile
worker` calls it with the Settings its flags make; `celery -A turnstile.worker.runtime.app:app
worker` finds the app through this module's attribute lookup, which builds the worker from the
`TURNSTILE_*` environment variables, read once there: that is a Celery-started worker's edge.
Each edge also sets what a library configured only by the environment must find there before
Celery starts (`worker_environment`: prometheus_client's directory); nothing deeper writes it.

Acks are late and a lost worker's message is rejected back to the queue, so a step that dies
mid-turn is delivered again; the version compare-and-set in the store makes every extra
delivery harmless. Prefetch is one: a worker holds only the message it is running.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from celery import Celery

from turnstile.worker.broker import app as broker_app
from turnstile.worker.observability import metrics
from turnstile.worker.runtime import hooks, pools, task
from turnstile.worker.runtime.pools import Pool
from turnstile.worker.runtime.services import WorkerServices
from turnstile.worker.settings import Settings


def make_app(config: Settings, *, main: bool = True) -> Celery:
    """A worker's Celery app configured from `config` (worker/broker/app.py), its broker
    connections bounded for its pool; made the current app unless `main` is false."""
    return broker_app.make_app(config, main=main, pool_limit=broker_pool_limit(config))


def broker_pool_limit(config: Settings) -> int:
    """Broker connections kept by one process: one per turn a green worker holds in flight,
    else a few (a prefork process runs one turn at a time)."""
    if config.pool == Pool.GEVENT:
        return config.concurrency + pools.SPARE_CONNECTIONS
    return broker_app.DEFAULT_POOL_LIMIT


@dataclass(frozen=True)
class Worker:
    """A worker process: its app with the step task, its services and its hooks, connected."""

    app: Celery
    services: WorkerServices
    hooks: tuple[hooks.Hook, ...]

    def announced_exitcode(self) -> int:
        """The exit status a shutdown signal announced (hooks.ExitCodeHook); 0 if none."""
        codes = (h.exitcode() for h in self.hooks if isinstance(h, hooks.ExitCodeHook))
        return max(codes, default=0)


_worker: list[Worker] = []
_lock = threading.Lock()


def build_worker(config: Settings) -> Worker:
    """This process's worker, built from `config` when it starts: one per process (a process
    is one Celery worker), so a later call returns the first."""
    with _lock:
        if not _worker:
            app = make_app(config)
            services = WorkerServices(config, app)
            task.register(app, services)
            connected = tuple(hooks.worker_hooks(services))
            hooks.install(connected)
            _worker.append(Worker(app, services, connected))
        return _worker[0]


def worker_environment(config: Settings, environ: Mapping[str, str]) -> dict[str, str]:
    """What the worker's own environment (`environ`) must hold before Celery starts, for a
    library that reads its configuration only there: with metrics on, prometheus_client's
    PROMETHEUS_MULTIPROC_DIR, the directory every process of the worker writes its samples
    in (the one `environ` names, emptied, else a private one; worker/observability/metrics.py).
    The edge that starts the worker sets it, and the pool inherits it."""
    if not config.metrics_port:
        return {}
    named = environ.get(metrics.MULTIPROC_DIR_ENV)
    return {metrics.MULTIPROC_DIR_ENV: metrics.prepare_dir(named)}


def __getattr__(name: str) -> Any:
    """`celery -A turnstile.worker.runtime.app:app` finds the worker's app by this lookup,
    which builds the worker, its Settings read from the environment: the edge of a worker
    Celery starts, which sets what its environment must hold (`worker_environment`)."""
    if name == "app":
        if not _worker:
            config = Settings()
            os.environ.update(worker_environment(config, os.environ))
            build_worker(config)
        return _worker[0].app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
