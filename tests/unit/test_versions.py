"""A job's version and the pure rules of a run meeting a worker of another version
(jobs/versions.py): a declared version is checked in one line, an undeclared one is derived
from what a run depends on, and a migration works on a copy and pins the run to the new
version."""

from __future__ import annotations

import dataclasses

import pytest

from tests.version_jobs import (
    V2_MIGRATING,
    deploy_v1,
    deploy_v1_other,
    deploy_v2,
    deploy_v2_migrating,
    from_v1,
)
from turnstile import Job
from turnstile.jobs.errors import JobDefinitionError
from turnstile.jobs.runs import new_run
from turnstile.jobs.versions import Meeting, NoPath, meets, migrated
from turnstile.worker.registry import Registry


def _bare(**kw: object) -> Job:
    return Job(name="bare", tools={}, model="openai:gpt-4.1-mini", **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", ["", " v1", "v 1", "v1/2", "x" * 41, "-v1", 3])
def test_an_invalid_declared_version_is_refused_in_one_line(bad: object) -> None:
    """A version that is not 1-40 letters, digits and . _ + - (starting with a letter or a
    digit) is a JobDefinitionError of one line naming the job; "" means derive one."""
    if bad == "":
        assert _bare(version="").version.startswith("h-")
        return
    with pytest.raises(JobDefinitionError) as caught:
        _bare(version=bad)
    assert "\n" not in str(caught.value) and "job 'bare': version" in str(caught.value)


def test_a_derived_version_follows_what_a_run_depends_on() -> None:
    """Same tools and params: the same derived version; a renamed tool or an added parameter:
    another. A declared version keeps the derived fingerprint, so two definitions under one
    declared version are told apart."""
    assert _bare().version == _bare().version
    assert deploy_v1().version == "v1" and deploy_v2().version == "v2"
    assert deploy_v1().fingerprint != deploy_v1_other().fingerprint
    assert deploy_v1().fingerprint == deploy_v1().fingerprint
    renamed = Job(name="deploy", tools=deploy_v2().tools, model="openai:gpt-4.1-mini",
                  params_schema=deploy_v1().params_schema)  # fmt: skip
    assert renamed.version not in (deploy_v1().version, derived_v1())


def derived_v1() -> str:
    job = deploy_v1()
    return Job(name="deploy", tools=job.tools, model="openai:gpt-4.1-mini",
               params_schema=job.params_schema).version  # fmt: skip


def test_bad_migrations_are_refused() -> None:
    """A migration from its own version, from an invalid one, or that is not a function, and
    a no_path that is neither wait nor end: one line each."""
    for kw, said in (
        ({"version": "v2", "migrate": {"v2": from_v1}}, "its own version"),
        ({"migrate": {"bad version": from_v1}}, "invalid version"),
        ({"migrate": {"v1": 3}}, "not a function"),
        ({"no_path": "maybe"}, "no_path must be"),
    ):
        with pytest.raises(JobDefinitionError, match=said):
            _bare(**kw)


def test_a_run_meets_a_worker_of_its_version_of_another_or_one_that_migrates() -> None:
    """Same version (or a run from before versions): here. Another: elsewhere, unless the job
    migrates from it; a job that migrates others and says `end` ends a run it cannot."""
    m = {"v1": from_v1}
    assert meets("v1", here="v1", migrate={}, no_path=NoPath.WAIT) is Meeting.SAME
    assert meets("", here="v2", migrate={}, no_path=NoPath.WAIT) is Meeting.SAME
    assert meets("v1", here="v2", migrate={}, no_path=NoPath.END) is Meeting.ELSEWHERE
    assert meets("v1", here="v2", migrate=m, no_path=NoPath.WAIT) is Meeting.MIGRATE
    assert meets("v0", here="v2", migrate=m, no_path=NoPath.WAIT) is Meeting.ELSEWHERE
    assert meets("v0", here="v2", migrate=m, no_path=NoPath.END) is Meeting.NO_PATH


def test_a_migration_works_on_a_copy_and_pins_the_run_to_the_new_version() -> None:
    """The run is pinned to its job's version at submit; migrated, it carries the new version
    and parameter; a migration that raises leaves the state as it was."""
    state = new_run(run_id="r1", tenant="t", user_id="u", job=deploy_v1(), goal="g")
    assert state.job_version == "v1"
    after = migrated(state, from_v1, to=deploy_v2_migrating().version)
    assert (after.job_version, after.params["tone"]) == ("v2", "plain")
    assert state.job_version == "v1" and "tone" not in state.params

    def breaks(s: object) -> None:
        s.params["half"] = True  # type: ignore[attr-defined]
        raise ValueError("no")

    with pytest.raises(ValueError, match="no"):
        migrated(state, breaks, to="v2")
    assert "half" not in state.params


def test_a_job_remade_with_more_tools_keeps_its_version() -> None:
    """A worker adds a job's MCP tools by remaking it (`dataclasses.replace`): the version its
    runs were pinned to at submit, derived without them, stays the job's."""
    job = _bare()
    remade = dataclasses.replace(job, tools=deploy_v1().tools)
    assert remade.version == job.version and remade.fingerprint != job.fingerprint


def test_turnstile_jobs_names_each_jobs_version_and_what_it_migrates_from() -> None:
    """`turnstile jobs --json` gives each job's version and the versions it migrates from."""
    registry = Registry(None, spec=f"{V2_MIGRATING}")
    (row,) = [r for r in registry.describe() if r["name"] == "deploy"]
    assert (row["version"], row["migrates_from"]) == ("v2", ["v1"])
