"""A job's version: declared (`Job(version="2025-06")`) or derived from what a run depends on,
and the pure rules of a run meeting a worker whose version of its job differs.

A run is pinned at submit to the version of its job that created it (`RunState.job_version`).
A worker runs a step only when its version of the job is the run's, or when the job can
migrate the run's state from the run's version (`Job(migrate={"v1": fn})`): `meets` says
which. The fingerprint is the derived version whatever the job declares: two workers that
claim one declared version with different fingerprints are running different code under one
name, and the second is refused as it starts.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping
from enum import StrEnum
from typing import TYPE_CHECKING, Any, cast

import msgspec

from turnstile.jobs.state import SCHEMA_VERSION, RunState

if TYPE_CHECKING:
    from turnstile.jobs.tools import Tool

VERSION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+\-]{0,39}")
DERIVED_PREFIX = "h-"  # a derived version: "h-" and 12 hex digits of the fingerprint

# A migration upgrades a run's state from one named version of its job to the current one, at
# the run's next turn boundary: it changes the state in place (or returns a new one). Pure: it
# may run again if the worker dies before the turn's commit (the commit is what counts).
Migration = Callable[[RunState], RunState | None]


class NoPath(StrEnum):
    """What a run of a version its worker neither serves nor can migrate does."""

    WAIT = "wait"  # park, visibly, until a worker of its version takes it
    END = "end"  # end the run `error`, saying which version had no path


def version_problem(version: object) -> str | None:
    """Why a declared version is not valid, in words, or None."""
    if not isinstance(version, str) or not VERSION.fullmatch(version):
        return (
            f"version {version!r} is not valid: 1-40 letters, digits, '.', '_', '+', '-', "
            "starting with a letter or digit"
        )
    return None


def fingerprint(
    tools: Mapping[str, Tool], params_schema: Mapping[str, Any], mcp: tuple[str, ...] = ()
) -> str:
    """What a run depends on, hashed: the tools' names and argument schemas and their
    contracts, the params schema, the MCP servers' names and the state format."""
    shape = {
        "tools": {name: _contract(t) for name, t in tools.items()},
        "params": params_schema,
        "mcp": list(mcp),
        "state": SCHEMA_VERSION,
    }
    return hashlib.sha256(msgspec.json.encode(shape, order="sorted")).hexdigest()[:32]


def _contract(t: Tool) -> dict[str, Any]:
    return {"schema": t.schema, "mutates": t.mutates, "reversible": t.reversible,
            "key_args": list(t.key_args), "charges": dict(t.charges)}  # fmt: skip


def derived(print_: str) -> str:
    return f"{DERIVED_PREFIX}{print_[:12]}"


def check_migrations(job_name: str, migrate: object) -> str | None:
    """Why a job's migrations are not valid, or None."""
    if not isinstance(migrate, Mapping):
        return f"job {job_name!r}: migrate must map versions to functions"
    for version, fn in cast(Mapping[object, object], migrate).items():
        if not isinstance(version, str) or not VERSION.fullmatch(version):
            return f"job {job_name!r}: migrate names an invalid version {version!r}"
        if not callable(fn):
            return f"job {job_name!r}: migrate[{version!r}] is not a function"
    return None


class Meeting(StrEnum):
    """A step of a run on this worker: its version here, a migration first, or elsewhere."""

    SAME = "same"
    MIGRATE = "migrate"
    ELSEWHERE = "elsewhere"  # not here: the run waits for a worker of its version
    NO_PATH = "no_path"  # not here, and the job says such a run ends


def meets(
    run_version: str, *, here: str, migrate: Mapping[str, Migration], no_path: NoPath
) -> Meeting:
    """How a run pinned to `run_version` meets a worker whose version of its job is `here`. A
    run made before versions were recorded (no version) takes the worker's."""
    if not run_version or run_version == here:
        return Meeting.SAME
    if run_version in migrate:
        return Meeting.MIGRATE
    if migrate and no_path is NoPath.END:
        return Meeting.NO_PATH
    return Meeting.ELSEWHERE


def migrated(state: RunState, fn: Migration, *, to: str) -> RunState:
    """The run's state after its migration, pinned to `to`. Whatever the function raises is
    the caller's to report (the run ends `error` with its text)."""
    copy = RunState.from_json(state.to_json())  # a migration that raises leaves `state` whole
    result = fn(copy)
    after = copy if result is None else result
    if not isinstance(after, RunState):
        raise TypeError(f"the migration returned {type(after).__name__}, not a RunState")
    if after.run_id != state.run_id or after.tenant != state.tenant or after.job != state.job:
        raise ValueError("a migration may not change the run's id, tenant or job")
    after.job_version = to
    after.schema_version = SCHEMA_VERSION
    return after
