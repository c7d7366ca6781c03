"""Prometheus metrics of the worker: what each step did, how long it took, how runs ended.

Celery's prefork pool runs steps in child processes, so the metrics use prometheus-client's
multiprocess mode: every process writes its samples to files in `PROMETHEUS_MULTIPROC_DIR`,
and the worker's main process serves their aggregate on `TURNSTILE_METRICS_PORT`.

prometheus-client chooses how it stores values once, when it is first imported, from whether
`PROMETHEUS_MULTIPROC_DIR` is set, and each process writes its files in the directory that
variable names: it takes no other way to be told. So the worker's edge (`turnstile worker`, or
the app lookup of `celery -A turnstile.worker.runtime.app:app`) asks `prepare_dir` for the
directory and sets the variable in its own environment before Celery starts; this module
neither reads nor writes the environment. `prometheus_client` is imported here only inside
`enable`, which runs in the main process on `worker_init`, before the pool forks: it imports,
then builds the metrics, and the children inherit both and the variable. With metrics off
nothing is imported, no server runs, and each recording call is one `if`.

The directory: `PROMETHEUS_MULTIPROC_DIR` if the worker's environment names one (it is emptied
of metric files at start, as the client's documentation asks, so give each worker its own),
otherwise a private temporary directory, removed when the worker exits.
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import os
import shutil
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import structlog

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
    from prometheus_client.metrics_core import Metric

log = structlog.get_logger("turnstile.metrics")

MULTIPROC_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"
# Bound to every interface: Prometheus scrapes the worker from another host (a pod, a container).
LISTEN_ADDR = "0.0.0.0"  # noqa: S104

# A step is anything from a no-op skip (milliseconds) to a turn with slow tools (minutes).
STEP_BUCKETS_S = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
# Between two turns: well under a millisecond eager, a few milliseconds through the queue.
GAP_BUCKETS_S = (0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0)

# Results of `Step.run` that end the run without passing through `Writer.next`, with the outcome
# and detail the run records. `finished` and `refused` are counted where they happen, in the
# step, because only there are the outcome and the refused dimension known.
_ENDS_RUN: dict[str, tuple[str, str]] = {
    "cancelled": ("cancelled", ""),
    "superseded": ("superseded", ""),  # a newer run of its conversation interrupted it
    "poison": ("error", ""),
    "broken": ("error", ""),
}


class Metrics:
    """The worker's metrics. In the worker they are registered nowhere (`registry=None`):
    multiprocess mode writes them to files and the served registry reads those."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        from prometheus_client import Counter, Gauge, Histogram  # noqa: PLC0415 - see the docstring

        self.steps: Counter = Counter(
            "turnstile_steps_total",
            "Step deliveries handled, by what the step returned (continued, finished, "
            "suspended, parked, refused, stale, ...; retry when the store or ledger was down).",
            ["result"],
            registry=registry,
        )
        self.step_seconds: Histogram = Histogram(
            "turnstile_step_seconds",
            "Wall time of one step delivery, by what the step returned.",
            ["result"],
            buckets=STEP_BUCKETS_S,
            registry=registry,
        )
        self.turn_gap: Histogram = Histogram(
            "turnstile_turn_gap_seconds",
            "Time from a run's commit to the start of its next turn, by path: eager (claimed by "
            "the commit, run at once by the same worker) or queued (through the pending list, "
            "the dispatcher and the broker).",
            ["path"],
            buckets=GAP_BUCKETS_S,
            registry=registry,
        )
        self.steps_in_progress: Gauge = Gauge(
            "turnstile_steps_in_progress",
            "Steps running now, summed over the live pool processes.",
            multiprocess_mode="livesum",
            registry=registry,
        )
        self.runs_finished: Counter = Counter(
            "turnstile_runs_finished_total",
            "Runs that recorded a terminal outcome, by outcome and detail (the resource or "
            "detector that fired, e.g. deadline, tenant.cost_microusd, repeated_call).",
            ["outcome", "detail"],
            registry=registry,
        )
        self.ledger_refusals: Counter = Counter(
            "turnstile_ledger_refusals_total",
            "Turns the tenant's ledger refused at admission, by the first dimension that did "
            "not fit; each ends its run budget_exhausted(tenant.<dimension>).",
            ["dimension"],
            registry=registry,
        )
        self.step_retries: Counter = Counter(
            "turnstile_step_retries_total",
            "Steps put back on the queue with backoff, by reason (ledger_down, store_unavailable).",
            ["reason"],
            registry=registry,
        )
        self.dead_letters: Counter = Counter(
            "turnstile_dead_letters_total",
            "Queue entries a worker could not take in (not JSON, a broken envelope, an unknown "
            "task, ...), moved to the queue's dead letters, by reason.",
            ["reason"],
            registry=registry,
        )
        # Provider rate limits (worker/scheduling/ratelimits.py).
        self.rate_deferred: Counter = Counter(
            "turnstile_rate_limit_deferred_total",
            "Turns deferred by a provider rate limit set with `turnstile limits`, by model "
            "endpoint and the limit that deferred them (rpm, tpm, 429, tenant.rpm, ...).",
            ["endpoint", "limit"],
            registry=registry,
        )
        self.rate_wait: Histogram = Histogram(
            "turnstile_rate_limit_wait_seconds",
            "How long a deferred turn was told to wait for its endpoint's bucket.",
            ["endpoint"],
            buckets=STEP_BUCKETS_S,
            registry=registry,
        )
        # Deploys (jobs/versions.py): runs that wait for a worker of their job's version, and
        # runs migrated to the worker's.
        self.version_waits: Counter = Counter(
            "turnstile_version_waits_total",
            "Steps parked because no worker that took them serves their run's job version "
            "(the run waits for one: `turnstile jobs versions`).",
            ["job", "version"],
            registry=registry,
        )
        self.version_waiting: Gauge = Gauge(
            "turnstile_version_waiting_runs",
            "Runs parked waiting for a worker of their job's version, as the last heartbeat of "
            "a worker that serves it saw them (a version no live worker serves is not counted "
            "here: `turnstile jobs versions` shows it).",
            ["job", "version"],
            multiprocess_mode="mostrecent",
            registry=registry,
        )
        self.migrations: Counter = Counter(
            "turnstile_migrations_total",
            "Runs migrated from one version of their job to another, by result (ok, error).",
            ["job", "from_version", "result"],
            registry=registry,
        )
        self.provider_429: Counter = Counter(
            "turnstile_provider_rate_limited_total",
            "429 answers from a provider on an endpoint with limits (each empties the bucket "
            "for every worker until the wait it asked for is over).",
            ["endpoint"],
            registry=registry,
        )
        # Fair share, set by the dispatcher (the worker that holds its lock) once a second.
        self.tenant_waiting: Gauge = Gauge(
            "turnstile_tenant_waiting_steps",
            "Steps of the tenant waiting in its pending lists for the dispatcher.",
            ["tenant"],
            multiprocess_mode="mostrecent",
            registry=registry,
        )
        self.tenant_in_flight: Gauge = Gauge(
            "turnstile_tenant_turns_in_flight",
            "The tenant's steps dispatched and not yet done (what its cap counts).",
            ["tenant"],
            multiprocess_mode="mostrecent",
            registry=registry,
        )
        self.tenant_cap: Gauge = Gauge(
            "turnstile_tenant_turns_cap",
            "The tenant's cap on turns in flight; -1 when it has none.",
            ["tenant"],
            multiprocess_mode="mostrecent",
            registry=registry,
        )


@dataclass
class _State:
    """This process's metrics: set once in the main process, inherited by the pool on fork."""

    metrics: Metrics | None = None
    path: str | None = None
    server: WSGIServer | None = None


_state = _State()


def enabled() -> bool:
    return _state.metrics is not None


# -- recording: called in the pool processes, on every step ------------------------------------


def step_started() -> float:
    """Call as a step starts; pass what it returns to `step_done`."""
    if _state.metrics is not None:
        _state.metrics.steps_in_progress.inc()
    return time.monotonic()


def step_done(result: str, started: float) -> None:
    """The step returned `result` (or `retry`, `exception`); `started` is from `step_started`."""
    m = _state.metrics
    if m is None:
        return
    m.steps_in_progress.dec()
    m.steps.labels(result).inc()
    m.step_seconds.labels(result).observe(time.monotonic() - started)
    if result in _ENDS_RUN:
        m.runs_finished.labels(*_ENDS_RUN[result]).inc()


def turn_gap(seconds: float, *, eager: bool) -> None:
    """A continuing run's next turn started `seconds` after the commit before it."""
    if _state.metrics is not None:
        _state.metrics.turn_gap.labels("eager" if eager else "queued").observe(max(0.0, seconds))


def step_retried(reason: str) -> None:
    if _state.metrics is not None:
        _state.metrics.step_retries.labels(reason).inc()


def message_dead_lettered(reason: str) -> None:
    """A queue entry went to the dead letters (in the worker's main process)."""
    if _state.metrics is not None:
        _state.metrics.dead_letters.labels(reason).inc()


def run_finished(outcome: str, detail: str | None) -> None:
    """A turn's move was Finished and its commit went through."""
    if _state.metrics is not None:
        _state.metrics.runs_finished.labels(outcome, detail or "").inc()


def tenant_refused(dimension: str) -> None:
    """The tenant's ledger refused the turn; the run ends budget_exhausted(tenant.<dimension>)."""
    m = _state.metrics
    if m is not None:
        m.ledger_refusals.labels(dimension).inc()
        m.runs_finished.labels("budget_exhausted", f"tenant.{dimension}").inc()


def rate_deferred(endpoint: str, limit: str, wait_s: float) -> None:
    """A turn was deferred by `endpoint`'s `limit` for `wait_s`."""
    m = _state.metrics
    if m is not None:
        m.rate_deferred.labels(endpoint, limit).inc()
        m.rate_wait.labels(endpoint).observe(max(0.0, wait_s))


def version_waiting(job: str, version: str) -> None:
    """A step parked: its run waits for a worker of that version of its job."""
    m = _state.metrics
    if m is not None:
        m.version_waits.labels(job, version).inc()


def versions_waiting(counts: dict[tuple[str, str], int]) -> None:
    """A version heartbeat's count of the runs waiting for each job version it serves."""
    m = _state.metrics
    if m is not None:
        for (job, version), n in counts.items():
            m.version_waiting.labels(job, version).set(n)


def migrated(job: str, from_version: str, result: str) -> None:
    """A run's state was migrated from `from_version` (result ok), or its migration raised."""
    m = _state.metrics
    if m is not None:
        m.migrations.labels(job, from_version, result).inc()


def provider_rate_limited(endpoint: str) -> None:
    """The provider answered 429 on a limited endpoint."""
    if _state.metrics is not None:
        _state.metrics.provider_429.labels(endpoint).inc()


def tenant_share(tenant: str, *, waiting: int, in_flight: int, cap: int | None) -> None:
    """The dispatcher's view of one tenant: steps waiting, turns in flight, its cap."""
    m = _state.metrics
    if m is not None:
        m.tenant_waiting.labels(tenant).set(waiting)
        m.tenant_in_flight.labels(tenant).set(in_flight)
        m.tenant_cap.labels(tenant).set(-1 if cap is None else cap)


def process_dead(pid: int) -> None:
    """A pool process is exiting: drop its live gauges (`steps_in_progress`)."""
    if _state.metrics is not None and _state.path is not None:
        _mark_dead(pid, _state.path)


# -- setup: in the worker's main process ---------------------------------------------------------


def prepare_dir(named: str | None) -> str:
    """The directory this worker's processes write their samples in, ready: `named` (the
    worker's PROMETHEUS_MULTIPROC_DIR) emptied of a previous worker's files, else a private
    temporary directory removed when the worker exits. The caller, the worker's edge, sets
    PROMETHEUS_MULTIPROC_DIR to it before prometheus_client is imported."""
    if named:
        os.makedirs(named, exist_ok=True)
        for stale in glob.glob(os.path.join(named, "*.db")):
            os.remove(stale)  # a previous worker's samples would be added to ours
        _state.path = named
        return named
    path = tempfile.mkdtemp(prefix="turnstile-metrics-")
    # Pool processes leave through os._exit, so only the main process runs this.
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    _state.path = path
    return path


def enable(port: int | None) -> bool:
    """Turn metrics on for this process and the pool it will fork; False if `port` is off
    (None or 0), or the worker's edge prepared no directory, or prometheus_client was
    imported before the directory was set."""
    if not port or _state.metrics is not None:
        return _state.metrics is not None
    if _state.path is None:
        log.error("metrics_disabled", why="no metrics directory was prepared as the worker started")
        return False
    from prometheus_client import values  # noqa: PLC0415 - only after the directory is set

    if values.ValueClass is values.MutexValue:
        log.error(
            "metrics_disabled",
            why="prometheus_client was imported before PROMETHEUS_MULTIPROC_DIR was set",
        )
        return False
    _state.metrics = Metrics()
    return True


def serve(port: int | None) -> int | None:
    """Serve the aggregate of every process's metrics on `port`; returns the port bound."""
    path = _state.path
    if _state.metrics is None or path is None or not port or _state.server is not None:
        return None
    from prometheus_client import CollectorRegistry, start_http_server  # noqa: PLC0415

    registry = CollectorRegistry()
    registry.register(_LiveCollector(path))
    try:
        _state.server, _ = start_http_server(port, LISTEN_ADDR, registry)
    except OSError as exc:
        log.error("metrics_server_failed", port=port, error=str(exc))
        return None
    bound: int = _state.server.server_address[1]
    log.info("metrics_serving", port=bound, multiproc_dir=path)
    return bound


class _LiveCollector:
    """The multiprocess collector, after dropping the live gauges of pool processes that died
    without running their exit hooks (killed by a hard time limit, or by a crash)."""

    def __init__(self, path: str) -> None:
        from prometheus_client import multiprocess  # noqa: PLC0415

        self._path = path
        self._inner = multiprocess.MultiProcessCollector(None, path)  # type: ignore[no-untyped-call]

    def collect(self) -> Iterable[Metric]:
        for pid in _dead_pids(glob.glob(os.path.join(self._path, "gauge_live*_*.db"))):
            _mark_dead(pid, self._path)
        collected: Iterable[Metric] = self._inner.collect()  # type: ignore[no-untyped-call]
        return collected


def _mark_dead(pid: int, path: str) -> None:
    from prometheus_client import multiprocess  # noqa: PLC0415 - imported by `enable` already

    multiprocess.mark_process_dead(pid, path)  # type: ignore[no-untyped-call]


def _dead_pids(files: Iterable[str]) -> set[int]:
    pids = set()
    for name in files:
        with contextlib.suppress(ValueError):
            pids.add(int(os.path.basename(name).rsplit("_", 1)[1].removesuffix(".db")))
    return {pid for pid in pids if not _alive(pid)}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
