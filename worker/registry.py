"""The jobs a process can run, found as plugins: ONE registry for the worker, submit, replay,
the demo, the scenarios and the Python client.

A job is registered, never edited in: through the entry-point group `turnstile.jobs` (the
name is the job's name; the object is a Job or a factory returning one) or through
`TURNSTILE_JOBS=module:attr[,module:attr]`. A factory may take one argument, the worker's
Redis client; it is given None when the job is built to run in this process alone (replay,
listing), and should then use an in-memory world.

A plugin that fails (does not import, its factory raises or returns something else, its
tool schema is not JSON Schema, its default or fallback model string names a provider this
process does not know or is a typing slip from a known model, its name is taken by another
registration) is recorded as broken with one line saying why; the other jobs are unaffected.
The same `module:attr` named twice (an entry point and TURNSTILE_JOBS) is one registration.

TURNSTILE_JOBS and the providers' configuration come from the process's Settings
(`Registry.from_settings`): the registry reads no environment.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any

import msgspec
import redis
import structlog

from turnstile.jobs.errors import UnknownJobError
from turnstile.jobs.job import Job
from turnstile.providers.config import ProviderConfig

if TYPE_CHECKING:
    from turnstile.worker.settings import Settings

log = structlog.get_logger("turnstile.registry")

GROUP = "turnstile.jobs"
ENV = "TURNSTILE_JOBS"


@dataclass
class Plugin:
    """One registration: where it came from, and the job it gave or why it gave none."""

    source: str  # "entry point support = turnstile.support:support", "TURNSTILE_JOBS m:attr"
    name: str | None  # the registered name (an entry point's), or None until built
    load: Callable[[], Any] = field(repr=False)
    job: Job | None = None
    error: str | None = None


def _import_ref(ref: str) -> Callable[[], Any]:
    module, sep, attr = ref.partition(":")

    def load() -> Any:
        if not sep or not module.strip() or not attr.strip():
            raise ValueError(f"expected module:attr, got {ref!r}")
        obj: Any = importlib.import_module(module.strip())
        for part in attr.strip().split("."):
            obj = getattr(obj, part)
        return obj

    return load


def _target(ref: str) -> str:
    """`module:attr` as written, spaces around each part dropped: one target, however spaced."""
    module, sep, attr = ref.partition(":")
    return f"{module.strip()}{sep}{attr.strip()}"


def candidates(spec: str) -> list[Plugin]:
    """Every registration this process can see, the entry points' and those of `spec` (the
    value of TURNSTILE_JOBS), in a stable order; nothing is imported yet. A `module:attr` named
    by an entry point and again by TURNSTILE_JOBS (or twice there) is one registration, the
    first."""
    points = sorted(entry_points(group=GROUP), key=lambda e: (e.name, e.value))
    found = [Plugin(f"entry point {ep.name} = {ep.value}", ep.name, ep.load) for ep in points]
    seen = {_target(ep.value) for ep in points}
    for ref in (part.strip() for part in spec.split(",")):
        if ref and _target(ref) not in seen:
            seen.add(_target(ref))
            found.append(Plugin(f"{ENV} {ref}", None, _import_ref(ref)))
    return found


def check_models(job: Job, providers: ProviderConfig) -> None:
    """A job's default and fallback model strings, checked when it is registered: a provider
    this process knows, and no typing slip from a known model (providers `check`); a named
    endpoint's key is a run's concern. ProviderConfigError says what is wrong."""
    from turnstile.providers import check  # noqa: PLC0415 - the providers' tables, on demand

    for spec in (job.model if isinstance(job.model, str) else None, job.fallback_model):
        if spec is not None:
            check(spec, providers, keys=False)


def _takes_client(factory: Callable[..., Any]) -> bool:
    try:
        params = list(inspect.signature(factory).parameters.values())
    except (TypeError, ValueError):
        return False
    return any(
        p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL) for p in params
    )


def _takes_drills(factory: Callable[..., Any]) -> bool:
    try:
        return "drills" in inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return False


def build(plugin: Plugin, client: redis.Redis | None, *, drills: bool = False) -> Job:
    """The plugin's job, built over this client (None: an in-process world of its own). A
    factory with a `drills` keyword is told whether failure drills may act here."""
    obj = plugin.load()
    if not isinstance(obj, Job):
        if not callable(obj):
            raise TypeError(f"{type(obj).__name__} is neither a Job nor a factory of one")
        extra = {"drills": drills} if _takes_drills(obj) else {}
        obj = obj(client, **extra) if _takes_client(obj) else obj(**extra)
    if not isinstance(obj, Job):
        raise TypeError(f"the factory returned {type(obj).__name__}, not a Job")
    if plugin.name is not None and obj.name != plugin.name:
        raise ValueError(f"registered as {plugin.name!r} but the job is named {obj.name!r}")
    return obj


def _reason(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}"[:300] if text else type(exc).__name__


class Registry:
    """The jobs of this process, built once over one Redis client (None: in-process only):
    the entry points' and those `spec` names (TURNSTILE_JOBS), their model strings checked
    against `providers`. A process builds it from its Settings (`from_settings`); the
    defaults are a process with nothing configured (the entry points alone, the built-in
    providers)."""

    def __init__(
        self,
        client: redis.Redis | None = None,
        *,
        spec: str = "",
        providers: ProviderConfig | None = None,
        drills: bool = False,
    ) -> None:
        self.client, self.drills = client, drills  # drills: TURNSTILE_ALLOW_DRILLS
        self.providers = providers or ProviderConfig()
        self.plugins = candidates(spec)
        for plugin in self.plugins:
            try:
                job = build(plugin, client, drills=drills)
                plugin.name = job.name  # a job with a bad model string is listed by its name
                check_models(job, self.providers)
                plugin.job = job
            except Exception as exc:  # any failure of a plugin is that plugin's, not ours
                plugin.error = _reason(exc)
        self._mark_duplicates()
        self._jobs = {p.name: p.job for p in self.plugins if p.job is not None and p.name}

    @classmethod
    def from_settings(cls, config: Settings, client: redis.Redis | None = None) -> Registry:
        """The jobs as `config` configures them: TURNSTILE_JOBS, the providers' configuration
        and TURNSTILE_ALLOW_DRILLS."""
        return cls(client, spec=config.jobs, providers=config.providers, drills=config.allow_drills)

    def _mark_duplicates(self) -> None:
        by_name: dict[str, list[Plugin]] = {}
        for plugin in self.plugins:
            if plugin.error is None and plugin.name:
                by_name.setdefault(plugin.name, []).append(plugin)
        for name, claimants in by_name.items():
            if len(claimants) > 1:
                sources = "; ".join(p.source for p in claimants)
                for plugin in claimants:
                    plugin.job, plugin.error = (
                        None,
                        f"job name {name!r} is registered twice: {sources}",
                    )

    def names(self) -> list[str]:
        """The jobs that built, by name."""
        return sorted(self._jobs)

    def broken(self) -> list[Plugin]:
        """The registrations that gave no job, each with why."""
        return [p for p in self.plugins if p.error is not None]

    def log_broken(self) -> None:
        """One line per broken plugin, naming it and the reason."""
        for plugin in self.broken():
            log.error("job_plugin_broken", plugin=plugin.source, reason=plugin.error)

    def get(self, name: str) -> Job:
        """The job of that name; UnknownJobError naming why (broken) and the known jobs."""
        job = self._jobs.get(name)
        if job is not None:
            return job
        known = ", ".join(self.names()) or "none"
        why = next((p.error for p in self.broken() if p.name == name), None)
        if why is not None:
            raise UnknownJobError(f"job {name!r} is broken ({why}); known jobs: {known}")
        # A plugin named only by TURNSTILE_JOBS gives its job's name when it is built: one that
        # broke may be the job asked for, and its reason is the one a person needs.
        nameless = "; ".join(f"{p.source}: {p.error}" for p in self.broken() if p.name is None)
        maybe = f"; broken, and it may be one of them: {nameless}" if nameless else ""
        raise UnknownJobError(f"unknown job {name!r}; known jobs: {known}{maybe}")

    def fresh(self, name: str) -> Job:
        """The job built anew for a run in this process alone (replay): a world of its own."""
        self.get(name)  # refuses a broken or unknown job with the list of known ones
        plugin = next(p for p in self.plugins if p.name == name and p.job is not None)
        return build(plugin, None)

    def dimensions(self) -> tuple[str, ...]:
        """The ledger dimensions the jobs declare, beyond the built-in four."""
        return tuple(sorted({d for job in self._jobs.values() for d in job.dimensions}))

    def describe(self) -> list[dict[str, Any]]:
        """Every registration, ok or broken, with its params schema and tools."""
        rows = [describe_plugin(p) for p in self.plugins]
        return sorted(rows, key=lambda r: (r["name"] or "", r["source"]))


def describe_plugin(plugin: Plugin) -> dict[str, Any]:
    row: dict[str, Any] = {"name": plugin.name, "source": plugin.source}
    if plugin.job is None:
        return {**row, "status": "broken", "error": plugin.error}
    job = plugin.job
    return {
        **row,
        "status": "ok",
        "description": job.description,
        "version": job.version,  # declared, or derived from its tools, params and state format
        "migrates_from": sorted(job.migrate),
        "params_schema": msgspec.to_builtins(job.params_schema),
        "dimensions": list(job.dimensions),
        "budget": msgspec.to_builtins(job.budget),
        # The default model when the job names it as a string (None: a Model or a factory);
        # a run's `model` and `fallback_model` params override them.
        "model": job.model if isinstance(job.model, str) else None,
        "fallback_model": job.fallback_model,
        "tools": [
            {
                "name": t.name,
                "description": t.description,
                "schema": msgspec.to_builtins(t.schema),
                "mutates": t.mutates,
                "reversible": t.reversible,
                "cost_bound_microusd": t.cost_bound_microusd,
                "timeout_s": t.timeout_s,
                "charges": dict(t.charges),
                "key_args": list(t.key_args),
            }
            for t in job.tools.values()
        ],
    }


Jobs = Registry  # the name the step's services use
