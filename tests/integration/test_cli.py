"""The operator commands end to end: decisions on suspended and parked runs, `watch` on a
running run, the read commands and their tenant scope, replay, and bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest
from typer.testing import CliRunner, Result

from tests.integration.workers import (
    WorkerProcess,
    client_for,
    running_workers,
    shop_effects,
    wait_until,
)
from turnstile.jobs.support.scenarios import BY_LETTER, GOAL, USER
from turnstile.worker.broker import layout
from turnstile.worker.cli.main import app
from turnstile.worker.client._client import Client
from turnstile.worker.store import keys

pytestmark = pytest.mark.integration

runner = CliRunner()
SLOW = {"sleep_s": {"get_order": 1.0, "send_status_email": 1.0}}


@pytest.fixture(scope="module")
def queue() -> str:
    return f"cli-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def pool(redis_url: str, queue: str) -> Iterator[list[WorkerProcess]]:
    with running_workers(redis_url, [queue], 1) as started:
        yield started


@pytest.fixture
def client(redis_url: str, pool: list[WorkerProcess]) -> Client:
    return client_for(redis_url)


def cli(redis_url: str, *args: str, **env: str) -> Result:
    return runner.invoke(app, list(args), env={"TURNSTILE_REDIS_URL": redis_url, **env})


def ok(result: Result) -> Result:
    assert result.exit_code == 0, result.output
    return result


def refused(result: Result, message: str, code: int = 1) -> None:
    """One clear line on stderr and a non-zero exit, never a traceback."""
    assert result.exit_code == code, result.output
    assert result.stderr.startswith("error: ") and message in result.stderr, result.stderr
    assert result.stderr.count("\n") == 1
    assert "Traceback" not in result.output


def _status(client: Client, run_id: str) -> str:
    return client.run_hash(run_id)[1]["status"]


def _events(client: Client, run_id: str) -> list[dict[str, Any]]:
    return [e for _, e in client.store.events(client.tenant_of(run_id), run_id)]


def _submit_g(redis_url: str, tenant: str, queue: str) -> str:
    g = BY_LETTER["G"].params
    result = ok(cli(redis_url, "submit", "--job", "support", "--tenant", tenant, "--user", USER,
                    "--goal", GOAL, "--param", f"order={g['order']}", "--param",
                    f"amount_cents={g['amount_cents']}", "--queue", queue, "--json"))  # fmt: skip
    return str(json.loads(result.stdout)["run_id"])


def test_approve_deny_and_cancel_suspended_runs(
    redis_url: str, client: Client, queue: str, unique: str
) -> None:
    """Three runs submitted from the command line suspend with a refund held. Approved, one
    completes with one refund; approving it again is refused and refunds nothing more. Denied,
    one ends approval_denied. Cancelled, one ends at once, and approving it then is a clear
    error that changes nothing. Who decided and when is in each run's events."""
    tenant = f"t-{unique}"
    approved, denied, cancelled = (_submit_g(redis_url, tenant, queue) for _ in range(3))
    runs = [approved, denied, cancelled]
    wait_until(lambda: all(_status(client, r) == "suspended" for r in runs), what="suspended")

    view = json.loads(ok(cli(redis_url, "status", approved, "--json")).stdout)
    assert view["pending"]["tool"] == "issue_refund"
    ok(cli(redis_url, "approve", approved, "--digest", view["pending"]["digest"], "--by", "ann"))
    refused(cli(redis_url, "approve", approved, "--by", "ann"), f"run {approved} ")
    wait_until(lambda: _status(client, approved) == "stopped", what="the approved run ends")
    refused(cli(redis_url, "approve", approved, "--by", "ann"), "already ended completed")
    assert client.state(approved).outcome == "completed"
    assert shop_effects(client, approved) == [
        ["refund", "ord_1004", 8000], ["email", "ord_1004"],
    ]  # fmt: skip
    decisions = [e for e in _events(client, approved) if e["type"] == "decision"]
    assert [(d["kind"], d["by"]) for d in decisions] == [("approved", "ann")]

    result = ok(cli(redis_url, "deny", denied, "--reason", "too much", "--by", "bo", "--json"))
    assert json.loads(result.stdout)["outcome"] == "approval_denied"
    assert shop_effects(client, denied) == []
    kinds = [(e["type"], e.get("by")) for e in _events(client, denied)][-2:]
    assert kinds == [("decision", "bo"), ("finished", None)]

    assert "cancelled run" in ok(cli(redis_url, "cancel", cancelled, "--by", "cy")).stdout
    before = client.run_hash(cancelled)[1]
    refused(cli(redis_url, "approve", cancelled, "--by", "ann"), "already ended cancelled")
    assert client.run_hash(cancelled)[1] == before
    stream = _events(client, cancelled)
    assert [e["type"] for e in stream].count("finished") == 1
    assert stream[-2]["kind"] == "cancelled" and stream[-2]["by"] == "cy" and stream[-2]["at"]
    for run_id in runs:  # the decisions replay: the kernel reaches the stored state again
        assert json.loads(ok(cli(redis_url, "replay", run_id, "--json")).stdout)["matches"]


def test_cancel_a_parked_run_and_a_running_one(
    redis_url: str, client: Client, queue: str, unique: str
) -> None:
    """A run parked by a tenant pause is cancelled at once, and resuming the tenant leaves
    it ended; a running run is cancelled at its next turn boundary."""
    tenant = f"t-{unique}"
    ok(cli(redis_url, "submit", "--job", "support", "--tenant", tenant, "--user", USER,
           "--goal", GOAL, "--queue", queue))  # fmt: skip
    ok(cli(redis_url, "pause", "--tenant", tenant, "--by", "ops"))
    run_id = client.submit(tenant, USER, "support", GOAL, {}, queue=queue)
    wait_until(lambda: _status(client, run_id) == "parked", what="the run parks")
    parked = json.loads(ok(cli(redis_url, "runs", "--tenant", tenant, "--status", "parked",
                               "--json")).stdout)  # fmt: skip
    assert run_id in [r["run_id"] for r in parked["runs"]]
    assert "cancelled run" in ok(cli(redis_url, "cancel", run_id, "--by", "ops")).stdout
    assert client.state(run_id).outcome == "cancelled"
    resumed = json.loads(ok(cli(redis_url, "resume", "--tenant", tenant, "--json")).stdout)
    assert run_id not in resumed["resumed"]
    time.sleep(0.5)
    assert _status(client, run_id) == "stopped"
    assert [e["type"] for e in _events(client, run_id)].count("finished") == 1

    slow = client.submit(tenant, USER, "support", GOAL, SLOW, queue=queue)

    def in_get_order() -> bool:  # its second turn (one second in get_order) is in flight
        pipe = client.client.pipeline(transaction=True)
        pipe.hget(keys.run(tenant, slow), "version")
        pipe.hexists(keys.inflight(tenant), slow)
        version, inflight = pipe.execute()
        return bool(version == "2" and inflight)

    wait_until(in_get_order, every_s=0.01, what="the slow run's turn is in flight")
    result = ok(cli(redis_url, "cancel", slow, "--by", "ops", "--reason", "wrong customer"))
    assert "next turn boundary" in result.stdout
    wait_until(lambda: _status(client, slow) == "stopped", what="the cancel lands")
    state = client.state(slow)
    assert (state.outcome, state.reason) == ("cancelled", "wrong customer")
    assert state.decisions[-1].by == "ops" and state.usage.steps < 5


def test_watch_prints_turns_as_they_happen_in_stored_order(
    redis_url: str, client: Client, queue: str, unique: str
) -> None:
    """`watch --json` on a running run prints each event as it is committed: the turns are
    printed while the run is still running, and the lines are the stored events, in the
    stored order. Without --json, one readable line per event. (The run is parked until the
    watcher is up, then resumed, so the watcher's start-up time does not matter.)"""
    tenant = f"t-{unique}"
    client.submit(tenant, USER, "support", GOAL, {}, queue=queue)  # the tenant is known now
    ok(cli(redis_url, "pause", "--tenant", tenant))  # held until the watcher is up
    run_id = client.submit(tenant, USER, "support", GOAL, SLOW, queue=queue)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TURNSTILE_")}
    seen: list[tuple[dict[str, Any], str, bool]] = []
    with subprocess.Popen(
        [sys.executable, "-c", "from turnstile.worker.cli.main import main; main()", "watch",
         run_id, "--json", "--redis-url", redis_url],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    ) as watcher:  # fmt: skip
        assert watcher.stdout is not None and watcher.stderr is not None
        for line in watcher.stdout:
            event = json.loads(line)
            if event["type"] == "parked":
                ok(cli(redis_url, "resume", "--tenant", tenant))
            stored = [e["type"] for e in _events(client, run_id)]
            seen.append((event, _status(client, run_id), "finished" in stored))
        assert watcher.wait(30) == 0, watcher.stderr.read()
    ids = [eid for eid, _ in client.store.events(tenant, run_id)]
    assert [event["id"] for event, _, _ in seen] == ids
    turns = [(event["step"], status, ended) for event, status, ended in seen
             if event["type"] == "turn"]  # fmt: skip
    assert [step for step, _, _ in turns] == [1, 2, 3, 4, 5]
    live = [step for step, status, ended in turns if status == "running" and not ended]
    assert len(live) >= 3, turns  # printed while the run was still going
    assert seen[-1][0]["type"] == "finished"

    lines = ok(cli(redis_url, "watch", run_id)).stdout.splitlines()
    assert lines[0] == f"submitted to queue {queue}"
    assert [line.split(":")[0] for line in lines if line.startswith("turn")] == [
        f"turn {i}" for i in range(1, 6)
    ]
    assert lines[-1].startswith("finished completed")


def test_read_commands_show_one_tenant_only_when_scoped(
    redis_url: str, client: Client, queue: str, unique: str
) -> None:
    """`runs --tenant` lists that tenant's runs alone (also through TURNSTILE_TENANT); a run of
    another tenant is not found by a scoped status, trace or replay; without a tenant an
    operator sees both. trace, replay and queues answer in JSON."""
    mine, theirs = f"a-{unique}", f"b-{unique}"
    a = client.submit(mine, USER, "support", GOAL, {}, queue=queue)
    b = client.submit(theirs, USER, "support", GOAL, {}, queue=queue)
    wait_until(lambda: _status(client, a) == _status(client, b) == "stopped", what="both end")

    listed = json.loads(ok(cli(redis_url, "runs", "--tenant", mine, "--json")).stdout)
    assert [r["run_id"] for r in listed["runs"]] == [a]
    assert listed["runs"][0]["outcome"] == "completed" and listed["next_cursor"] is None
    via_env = json.loads(ok(cli(redis_url, "runs", "--json", TURNSTILE_TENANT=mine)).stdout)
    assert [r["run_id"] for r in via_env["runs"]] == [a]
    everyone = {
        r["run_id"] for r in json.loads(ok(cli(redis_url, "runs", "--json")).stdout)["runs"]
    }
    assert {a, b} <= everyone
    done = json.loads(ok(cli(redis_url, "runs", "--tenant", mine, "--outcome", "completed",
                             "--json")).stdout)  # fmt: skip
    assert [r["run_id"] for r in done["runs"]] == [a]
    for command in ("status", "trace", "replay", "watch", "cancel"):
        refused(cli(redis_url, command, b, "--tenant", mine), f"no run {b!r} for tenant")
    table = ok(cli(redis_url, "runs", "--tenant", mine)).stdout
    assert a in table and b not in table

    traced = json.loads(ok(cli(redis_url, "trace", a, "--json")).stdout)
    assert [s["id"] for s in traced["spans"] if s["kind"] == "turn"] == [
        f"t{i}" for i in range(1, 6)
    ]
    assert traced["postmortem"]["input_tokens_by_turn"]
    assert "t2.c1 tool get_order ok" in ok(cli(redis_url, "trace", a)).stdout
    assert "same state" in ok(cli(redis_url, "replay", a)).stdout
    views = {q["name"]: q for q in json.loads(ok(cli(redis_url, "queues", "--json")).stdout)}
    assert views[queue]["depth"] == 0 and views[queue]["paused"] == ""


def test_replay_names_the_first_field_that_differs(
    redis_url: str, client: Client, queue: str, unique: str
) -> None:
    """A stored state that the recorded replies do not lead to is reported, with the first
    field that differs, and a non-zero exit."""
    tenant = f"t-{unique}"
    run_id = client.submit(tenant, USER, "support", GOAL, {}, queue=queue)
    wait_until(lambda: _status(client, run_id) == "stopped", what="the run ends")
    raw = msgspec.json.decode(client.run_hash(run_id)[1]["state"])
    raw["usage"]["tokens"] += 1
    client.client.hset(keys.run(tenant, run_id), "state", msgspec.json.encode(raw))
    result = cli(redis_url, "replay", run_id)
    assert result.exit_code == 1
    assert "differs at usage.tokens: stored 709, replayed 708" in result.stdout


BAD_INPUT = [
    (["approve", "run_nope"], 1, "no run 'run_nope'"),
    (["deny", "run_nope", "--reason", "x"], 1, "no run 'run_nope'"),
    (["cancel", "run_nope"], 1, "no run 'run_nope'"),
    (["status", "run_nope"], 1, "no run 'run_nope'"),
    (["watch", "run_nope"], 1, "no run 'run_nope'"),
    (["trace", "run_nope"], 1, "no run 'run_nope'"),
    (["replay", "run_nope"], 1, "no run 'run_nope'"),
    (["status", "{run}", "--tenant", "{other}"], 1, "no run"),
    (["pause", "--queue", "nope-{u}"], 1, "unknown queue 'nope-{u}'"),
    (["drain", "--queue", "nope-{u}"], 1, "unknown queue 'nope-{u}'"),
    (["resume", "--queue", "nope-{u}"], 1, "unknown queue 'nope-{u}'"),
    (["pause", "--tenant", "nope-{u}"], 1, "unknown tenant 'nope-{u}'"),
    (["runs", "--tenant", "nope-{u}"], 1, "unknown tenant 'nope-{u}'"),
    (["approve", "{run}"], 1, "is running, not suspended"),
    (["deny", "{run}", "--reason", "no"], 1, "is running, not suspended"),
    (["pause", "--queue", "{queue}", "--tenant", "{tenant}"], 2, "exactly one of"),
    (["pause"], 2, "exactly one of"),
    (["drain", "--queue", "{queue}", "--timeout-s", "5"], 2, "only with --wait"),
    (["runs", "--status", "bogus"], 1, "unknown status 'bogus'"),
    (["runs", "--outcome", "bogus"], 1, "unknown outcome 'bogus'"),
]


@pytest.fixture(scope="module")
def idle(redis_url: str) -> Iterator[dict[str, str]]:
    """A run waiting on a queue that no worker consumes, and a run of another tenant; ended
    afterwards, so that no sweeper keeps re-sending their steps."""
    client = client_for(redis_url)
    u = uuid.uuid4().hex[:8]
    tenant, other, queue = f"t-{u}", f"o-{u}", f"idle-{u}"
    run_id = client.submit(tenant, USER, "support", GOAL, {}, queue=queue)
    other_run = client.submit(other, USER, "support", GOAL, {}, queue=queue)
    yield {"run": run_id, "tenant": tenant, "other": other, "queue": queue, "u": u}
    client.store.fail_run(tenant, run_id, "the test is over")
    client.store.fail_run(other, other_run, "the test is over")
    client.client.delete(queue)


@pytest.mark.parametrize(
    ("args", "code", "message"), BAD_INPUT, ids=[" ".join(a) for a, _, _ in BAD_INPUT]
)
def test_bad_input_is_one_line_and_changes_nothing(
    redis_url: str, idle: dict[str, str], args: list[str], code: int, message: str
) -> None:
    """Unknown runs, queues and tenants, decisions on a run that holds no call, conflicting
    flags: one line, a non-zero exit, and nothing written."""
    client = client_for(redis_url)
    tenant, run_id, queue = idle["tenant"], idle["run"], idle["queue"]

    def snapshot() -> list[Any]:
        return [
            client.client.hgetall(keys.run(tenant, run_id)),
            client.client.xlen(keys.events(tenant, run_id)),
            client.client.hgetall(keys.control(tenant)),
            client.client.hgetall(keys.queue_control(queue)),
            steps(),
        ]

    def steps() -> int:
        # The idle runs' steps, waiting for a dispatcher or on the queue. A dispatcher of
        # another test's worker on this server may move them from one to the other meanwhile,
        # and a step it holds between its take and its publish is in neither: counted when two
        # reads 50 ms apart agree (each read one transaction).
        last = -1
        for _ in range(40):
            pipe = client.client.pipeline(transaction=True)
            for t in (tenant, idle["other"]):
                for kind in ("cont", "start"):
                    pipe.zcard(keys.pending(t, queue, kind))
            pipe.llen(layout.broker_queue(queue))
            count = int(sum(pipe.execute()))
            if count == last:
                break
            last = count
            time.sleep(0.05)
        return count

    before = snapshot()
    refused(cli(redis_url, *(a.format(**idle) for a in args)), message.format(**idle), code)
    assert snapshot() == before
