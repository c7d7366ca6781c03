"""Deploys while runs are in flight, with real workers of two versions of one job
(tests/version_jobs.py: v2 renamed v1's tool and added a parameter). Pinned: a v1 run's steps
never run on a v2 worker; they wait, parked and visible, until a v1 worker is back, then
complete. Migrating: every unfinished v1 run completes on v2 after one `migrated` event; a
migration that raises ends its run `error` with its text, nothing held, the others unharmed;
a worker killed inside a migration leaves it and its turn to run once. A worker claiming a
version a live worker serves under another definition is refused as it starts, in one line."""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from typer.testing import CliRunner

from tests.integration.workers import (
    WorkerProcess,
    client_for,
    ended_once,
    ledger_is_the_runs_usage,
    wait_until,
)
from tests.version_jobs import BREAK_MIGRATION, V1, V1_OTHER, V2, V2_MIGRATING
from turnstile.worker.cli.main import app
from turnstile.worker.client._client import Client
from turnstile.worker.store import versions as job_versions

pytestmark = pytest.mark.integration

TTL = {"TURNSTILE_VERSION_TTL_S": "1.5"}  # a heartbeat every 0.5 s


def _worker(
    redis_url: str, queue: str, spec: str, name: str, concurrency: int = 1
) -> WorkerProcess:
    return WorkerProcess(
        redis_url, [queue], name=f"{name}-{os.getpid()}-{time.monotonic_ns()}",
        env={"TURNSTILE_JOBS": spec, **TTL}, concurrency=concurrency,
    ).start()  # fmt: skip


@pytest.fixture
def queue() -> str:
    return f"ver-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def client(redis_url: str) -> Iterator[Client]:
    with client_for(redis_url, jobs=V1) as c:
        yield c


def _events(client: Client, tenant: str, run_id: str) -> list[dict[str, Any]]:
    return [e for _, e in client.store.events(tenant, run_id)]


def _turns(client: Client, tenant: str, run_id: str) -> list[dict[str, Any]]:
    return [e for e in _events(client, tenant, run_id) if e["type"] == "turn"]


def _code(turn: dict[str, Any]) -> str:
    """Which version's tool ran the turn ("" for a turn that called none: its `last_result` is
    still the turn before's, which may have run on the other version before a migration)."""
    if not any(span.get("kind") == "tool" for span in turn.get("spans") or []):
        return ""
    said = json.dumps(turn.get("last_result"))
    return "v2" if '"code": "v2"' in said else "v1" if '"code": "v1"' in said else ""


def _status(client: Client, run_id: str) -> dict[str, str]:
    return client.run_hash(run_id)[1]


def _parked_for_version(client: Client, run_id: str) -> bool:
    got = _status(client, run_id)
    return got["status"] == "parked" and got.get("reason", "").startswith(
        job_versions.WAITING_FOR_VERSION
    )


def _submit(client: Client, tenant: str, queue: str, n: int, **params: Any) -> list[str]:
    return [client.submit(tenant, "u1", "deploy", f"run {i}", params, queue=queue)
            for i in range(n)]  # fmt: skip


def _done(client: Client, ids: list[str]) -> bool:
    return all(_status(client, r)["status"] == "stopped" for r in ids)


def _started_v1(redis_url: str, client: Client, queue: str, tenant: str, n: int,
                **params: Any) -> tuple[list[str], set[str]]:  # fmt: skip
    """`n` runs begun on a v1 worker, which stops (warm) once a few turns are in: the run ids,
    and those that had finished by then."""
    v1 = _worker(redis_url, queue, V1, "v1")
    try:
        v1.wait_ready()
        ids = _submit(client, tenant, queue, n, **params)
        wait_until(lambda: sum(len(_turns(client, tenant, r)) for r in ids) >= 2,
                   timeout_s=60, what="the first v1 turns")  # fmt: skip
    finally:
        v1.stop()
    finished = {r for r in ids if _status(client, r)["status"] == "stopped"}
    assert len(finished) < n, "every run finished on v1: nothing was in flight"
    return ids, finished


runner = CliRunner()
DRAIN = ["jobs", "versions", "--job", "deploy", "--version", "v1", "--wait"]


def _versions_shown(redis_url: str, waiting: list[str]) -> None:
    """`turnstile jobs versions` while v1 runs wait: v1 has them waiting and no worker, v2 its
    worker; a drain of v1 that cannot finish says so in one line."""
    env = {"TURNSTILE_REDIS_URL": redis_url}
    shown = runner.invoke(app, ["jobs", "versions", "--json"], env=env)
    assert shown.exit_code == 0, shown.output
    rows = {(r["job"], r["version"]): r for r in json.loads(shown.output)}
    assert rows["deploy", "v1"]["waiting"] >= len(waiting) and not rows["deploy", "v1"]["workers"]
    assert rows["deploy", "v2"]["workers"]
    table = runner.invoke(app, ["jobs", "versions"], env=env)
    assert table.exit_code == 0 and "deploy" in table.output and "v1" in table.output
    stuck = runner.invoke(app, [*DRAIN, "--timeout-s", "0.2"], env=env)
    assert stuck.exit_code == 1
    assert "error: job 'deploy' version 'v1' still has" in stuck.output, stuck.output
    bad = runner.invoke(app, ["jobs", "versions", "--wait"], env=env)
    assert bad.exit_code == 2 and bad.output.startswith("error: --wait drains one version")


@pytest.mark.slow  # over 14 s on 2 cores: CI runs it in the slow part
def test_pinned_runs_wait_for_their_version_and_never_run_on_another(
    redis_url: str, client: Client, queue: str
) -> None:
    """Pinned (v2 declares no migration): v1 runs left in flight park on the v2 worker, each
    saying which version it waits for (`turnstile jobs versions` shows them), and complete
    once a v1 worker is back; every turn of every run ran v1's tool; no error; the ledger is
    the runs' usage. A worker claiming v1 with another definition meanwhile is refused."""
    tenant = f"pin-{uuid.uuid4().hex[:6]}"
    ids, finished = _started_v1(redis_url, client, queue, tenant, 6, turns=4, sleep_s=0.3)
    v2 = _worker(redis_url, queue, V2, "v2")
    try:
        v2.wait_ready()
        waiting = [r for r in ids if r not in finished]
        wait_until(lambda: all(_parked_for_version(client, r) for r in waiting), timeout_s=60,
                   what="the v1 runs parked on v2")  # fmt: skip
        reason = _status(client, waiting[0])["reason"]
        assert reason == f"{job_versions.WAITING_FOR_VERSION} v1 of job deploy"
        served = job_versions.live(client.client)
        assert ("deploy", "v2") in {(s.job, s.version) for s in served}
        assert ("deploy", "v1") not in {(s.job, s.version) for s in served}
        _versions_shown(redis_url, waiting)
        fresh = client.submit(tenant, "u1", "deploy", "after", {"turns": 1}, queue=queue)
        v1 = _worker(redis_url, queue, V1, "v1back")
        try:
            v1.wait_ready()
            _refused_as_it_starts(redis_url, queue)
            wait_until(lambda: _done(client, [*ids, fresh]), timeout_s=90,
                       what=lambda: str([_status(client, r)["status"] for r in ids]))  # fmt: skip
        finally:
            v1.stop()
    finally:
        v2.stop()
    for run_id in [*ids, fresh]:
        state = client.state(run_id)
        assert state.outcome is not None and state.outcome.value == "completed", run_id
        assert state.job_version == "v1"
        turns = _turns(client, tenant, run_id)
        assert {_code(t) for t in turns} - {""} == {"v1"}, run_id  # no v1 step ran on v2
        ended_once(client, tenant, run_id)
    drained = runner.invoke(
        app, [*DRAIN, "--timeout-s", "30"], env={"TURNSTILE_REDIS_URL": redis_url}
    )
    assert drained.exit_code == 0 and "drained: job deploy version v1" in drained.output
    parked = [e for r in waiting for e in _events(client, tenant, r) if e["type"] == "parked"]
    assert parked and all(e["why"].endswith("v1 of job deploy") for e in parked)
    ledger_is_the_runs_usage(client, tenant, [*ids, fresh])


@pytest.mark.slow  # over 14 s on 2 cores: CI runs it in the slow part
def test_migrated_runs_complete_on_the_new_version_after_one_migration_event(
    redis_url: str, client: Client, queue: str
) -> None:
    """Migrating (v2 migrates from v1): each v1 run left in flight gets one `migrated` event,
    v1 turns before it and v2 turns after it, and completes on v2 with the new parameter; a
    run whose migration raises ends `error` with the exception's text, nothing left held for
    the tenant, and the other runs are unaffected."""
    tenant = f"mig-{uuid.uuid4().hex[:6]}"
    ids, finished = _started_v1(redis_url, client, queue, tenant, 5, turns=4, sleep_s=0.3)
    broken = client.submit(tenant, "u1", "deploy", BREAK_MIGRATION, {"turns": 2}, queue=queue)
    v2 = _worker(redis_url, queue, V2_MIGRATING, "v2m")
    try:
        v2.wait_ready()
        wait_until(lambda: _done(client, [*ids, broken]), timeout_s=90,
                   what=lambda: str([_status(client, r) for r in ids]))  # fmt: skip
    finally:
        v2.stop()
    for run_id in ids:
        state = client.state(run_id)
        assert state.outcome is not None and state.outcome.value == "completed", run_id
        events = _events(client, tenant, run_id)
        migrations = [e for e in events if e["type"] == "migrated"]
        if run_id in finished:
            assert not migrations and state.job_version == "v1"
            continue
        assert [(e["from"], e["to"]) for e in migrations] == [("v1", "v2")], run_id
        assert state.job_version == "v2" and state.params["tone"] == "plain"
        at = events.index(migrations[0])
        before = {_code(e) for e in events[:at] if e["type"] == "turn"} - {""}
        after = {_code(e) for e in events[at:] if e["type"] == "turn"} - {""}
        assert before <= {"v1"} and after <= {"v2"}, run_id
        ended_once(client, tenant, run_id)
    state = client.state(broken)
    assert state.outcome is not None and state.outcome.value == "error"
    assert state.reason == (
        "the migration from version v1 raised ValueError: cannot migrate this run: its goal says so"
    )
    ledger_is_the_runs_usage(client, tenant, [*ids, broken])


@pytest.mark.slow
def test_a_worker_killed_inside_a_migration_leaves_it_and_its_turn_to_run_once(
    redis_url: str, client: Client, queue: str
) -> None:
    """SIGKILL while the migration runs: nothing of it was committed; the next worker migrates
    again and the run has one `migrated` event and one turn per version."""
    tenant = f"kill-{uuid.uuid4().hex[:6]}"
    ids, _ = _started_v1(redis_url, client, queue, tenant, 1, turns=3, sleep_s=1.0,
                         migrate_sleep_s=4.0)  # fmt: skip
    first = _worker(redis_url, queue, V2_MIGRATING, "v2k")
    first.wait_ready()
    wait_until(lambda: bool(first.events("run_migrating")), timeout_s=60, what="the migration")
    first.kill()
    second = _worker(redis_url, queue, V2_MIGRATING, "v2r")
    try:
        second.wait_ready()
        wait_until(lambda: _done(client, ids), timeout_s=90, what="the run after the kill")
    finally:
        second.stop()
    (run_id,) = ids
    events = _events(client, tenant, run_id)
    assert [e["type"] for e in events].count("migrated") == 1
    assert client.state(run_id).outcome is not None
    assert client.state(run_id).outcome.value == "completed"  # type: ignore[union-attr]
    ended_once(client, tenant, run_id)
    ledger_is_the_runs_usage(client, tenant, ids)


def _refused_as_it_starts(redis_url: str, queue: str) -> None:
    """Two definitions under one declared version: a worker of the second exits as it starts,
    saying in one line which live worker serves that version already."""
    other = _worker(redis_url, queue, V1_OTHER, "v1other")
    assert other.process is not None
    assert other.process.wait(60) != 0
    lines = [line for line in other.log().splitlines() if "error:" in line]
    assert lines and "job 'deploy' version 'v1' is served by worker" in lines[0], other.log()
    assert "Traceback" not in other.log()


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["pin", "migrate"])
def test_fifty_runs_through_a_rolling_deploy(redis_url: str, client: Client, mode: str) -> None:
    """The deploy drill: 50 runs start on two v1 workers; two v2 workers start (a tool
    renamed, a parameter added); the v1 workers stop mid-way. Pinned: no v1 step runs on v2
    (checked turn by turn), the runs wait until a v1 worker returns, then complete. Migrating:
    every run a v2 worker takes (while v1 still runs too) has one migration event, v1 turns
    before it and v2 turns after, and every run unfinished on v1 completes on v2. No `error`, each
    run ended once, the ledger exactly the runs' usage."""
    queue, tenant = f"drill-{uuid.uuid4().hex[:8]}", f"drill-{mode}-{uuid.uuid4().hex[:6]}"
    params = {"turns": 5, "sleep_s": 0.4}
    v1 = [_worker(redis_url, queue, V1, f"v1d{i}", concurrency=2) for i in range(2)]
    v2: list[WorkerProcess] = []
    try:
        for w in v1:
            w.wait_ready()
        ids = _submit(client, tenant, queue, 50, **params)
        wait_until(lambda: sum(len(_turns(client, tenant, r)) for r in ids) >= 20,
                   timeout_s=120, what="v1 under way")  # fmt: skip
        spec = V2 if mode == "pin" else V2_MIGRATING
        v2 = [_worker(redis_url, queue, spec, f"v2d{i}", concurrency=2) for i in range(2)]
        for w in v2:
            w.wait_ready()
    finally:
        for w in v1:
            w.stop()
    finished = {r for r in ids if _status(client, r)["status"] == "stopped"}
    assert len(finished) < len(ids), "every run finished on v1: nothing was in flight"
    back: list[WorkerProcess] = []
    try:
        if mode == "pin":
            waiting = [r for r in ids if r not in finished]
            wait_until(lambda: all(_parked_for_version(client, r) for r in waiting),
                       timeout_s=120, what="the v1 runs parked")  # fmt: skip
            back = [_worker(redis_url, queue, V1, f"v1b{i}", concurrency=2) for i in range(2)]
        wait_until(lambda: _done(client, ids), timeout_s=300, what="the drill's runs")
    finally:
        for w in [*v2, *back]:
            w.stop()
    for run_id in ids:
        state = client.state(run_id)
        assert state.outcome is not None and state.outcome.value == "completed", run_id
        events = _events(client, tenant, run_id)
        migrations = [e for e in events if e["type"] == "migrated"]
        turns = [e for e in events if e["type"] == "turn"]
        if mode == "pin" or not migrations:  # pinned, or finished on v1 before a v2 took it
            assert not migrations and {_code(t) for t in turns} - {""} == {"v1"}, run_id
            assert mode == "pin" or run_id in finished, run_id
        else:  # taken by a v2 worker (while v1 still ran, or after it stopped): migrated once
            assert len(migrations) == 1, run_id
            at = events.index(migrations[0])
            assert {_code(e) for e in events[:at] if e["type"] == "turn"} - {""} <= {"v1"}
            assert {_code(e) for e in events[at:] if e["type"] == "turn"} - {""} <= {"v2"}
        ended_once(client, tenant, run_id)
    ledger_is_the_runs_usage(client, tenant, ids)


def test_claims_in_the_store_refuse_another_definition_and_lapse(redis_url: str) -> None:
    """On a real server: a claim of a version that another live worker serves under another
    fingerprint is refused in one line and leaves nothing; the same fingerprint is shared;
    a released claim is gone at once, and one not renewed lapses with its TTL."""
    import redis  # noqa: PLC0415 - this test's own client

    r = redis.Redis.from_url(redis_url)
    job = f"claims-{uuid.uuid4().hex[:6]}"
    try:
        assert job_versions.claim(r, "w1", [(job, "v1", "aaa")], 60_000) is None
        assert job_versions.claim(r, "w2", [(job, "v1", "aaa")], 60_000) is None
        refused = job_versions.claim(r, "w3", [(job, "v1", "bbb")], 60_000)
        assert refused is not None and "\n" not in refused
        assert refused.startswith(f"job '{job}' version 'v1' is served by worker w")
        assert sorted(job_versions.serving(r, job, "v1")) == ["w1", "w2"]
        job_versions.release(r, "w1", [(job, "v1", "aaa")])
        assert job_versions.claim(r, "w4", [(job, "v2", "ccc")], 300) is None
        assert job_versions.serving(r, job, "v1") == ["w2"] and job_versions.serving(r, job, "v2")
        time.sleep(0.4)
        assert job_versions.serving(r, job, "v2") == []
    finally:
        job_versions.release(r, "w2", [(job, "v1", "aaa")])
        r.close()
