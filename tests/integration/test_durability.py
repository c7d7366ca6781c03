"""TURNSTILE_DURABILITY: acknowledged submissions, decisions and commits wait for the disk
(`aof`) or the replicas (`replica`); a server that cannot give the mode is refused at a
worker's and a client's start; a wait that falls short is an error the caller sees; and a
server killed right after acknowledgements loses none of them (tests/integration/test_crash.py
crashes its machine too)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from typer.testing import CliRunner

from tests.integration.workers import (
    TURNSTILE,
    WorkerProcess,
    client_for,
    running_workers,
    wait_until,
)
from turnstile.jobs.support.scenarios import BY_LETTER, GOAL, USER
from turnstile.worker.cli.main import app
from turnstile.worker.dev.embedded import EmbeddedServer
from turnstile.worker.ops import flags
from turnstile.worker.ops.subjects import Subject
from turnstile.worker.store import controls
from turnstile.worker.store.durability import DurabilityRefusedError
from turnstile.worker.store.runs import NotDurableError

pytestmark = pytest.mark.integration


@pytest.fixture
def aof_server() -> Iterator[EmbeddedServer]:
    """A server of this test's own, durable as the deploy files run it: AOF, fsync always."""
    with EmbeddedServer(appendonly=True) as server:
        yield server


def _runs(url: str, tenant: str) -> int:
    client = redis.Redis.from_url(url)
    try:
        return int(client.zcard(f"turnstile:{{{tenant}}}:runs"))
    finally:
        client.close()


def _set(url: str, name: str, value: str) -> None:
    client = redis.Redis.from_url(url)
    try:
        client.config_set(name, value)
    finally:
        client.close()


def _refused(url: str, durability: str, match: str) -> None:
    """A client asking `durability` of the server at `url` is refused at its start, in one
    line that matches `match`."""
    with pytest.raises(DurabilityRefusedError, match=match) as refused:
        client_for(url, durability=durability)
    assert "\n" not in str(refused.value)


def test_aof_durability_refuses_a_server_that_cannot_keep_it(
    aof_server: EmbeddedServer, own_server: EmbeddedServer
) -> None:
    """A client asking durability `aof` of a server without AOF, with `appendfsync no` or
    `everysec` (which answers WAITAOF before the fsync), or one that hides its CONFIG, is
    refused at its start in one line naming the setting to change; `always` is accepted."""
    assert client_for(aof_server.url, durability="aof")
    _refused(own_server.url, "aof", r"needs the server's appendonly yes \(it is no\): set "
             r"appendonly yes and appendfsync always on the server")  # fmt: skip
    _set(aof_server.url, "appendfsync", "no")
    _refused(aof_server.url, "aof", r"needs the server's appendfsync always \(it is no: the "
             r"server leaves fsync to the OS.*\): set appendfsync always")  # fmt: skip
    _set(aof_server.url, "appendfsync", "everysec")
    _refused(aof_server.url, "aof", r"\(it is everysec: under it valkey \d+\.\d+\.\d+ may "
             r"confirm a write before its fsync, the bug Redis PR #13793 fixes\): set "
             r"appendfsync always on the server")  # fmt: skip
    _set(aof_server.url, "appendfsync", "always")
    admin = redis.Redis.from_url(aof_server.url)
    admin.acl_setuser("noconfig", enabled=True, passwords=["+pw"], keys=["*"],
                      channels=["*"], commands=["+@all", "-config"])  # fmt: skip
    admin.close()
    hidden = f"redis://noconfig:pw@127.0.0.1:{aof_server.port}/0"
    _refused(hidden, "aof", r"cannot check the server's appendfsync: CONFIG GET is refused "
             r"\(.*\); allow it for this user \(ACL \+config\|get\)")  # fmt: skip


def test_aof_durability_refuses_writes_once_the_server_stops_fsyncing(
    aof_server: EmbeddedServer, unique: str
) -> None:
    """A durable client started against `appendfsync always` is told, per write, when the
    server is set to everysec (refused at once: it names the policy) or to `no` (the wait
    times out), and so is an observer's fence: nothing is acknowledged as durable that is
    not; set back to always, writes are acknowledged again."""
    queue, tenant = f"idle-{unique}", f"t-{unique}"
    durable = client_for(aof_server.url, durability="aof", durability_timeout_s=0.3)
    assert durable.submit(tenant, USER, "support", GOAL, {}, queue=queue)
    _set(aof_server.url, "appendfsync", "everysec")
    everysec = r"confirmed under the server's appendfsync everysec, which may confirm before"
    with pytest.raises(NotDurableError, match=everysec):
        durable.submit(tenant, USER, "support", GOAL, {}, queue=queue)
    with pytest.raises(NotDurableError, match=everysec):
        durable.store.fence()
    _set(aof_server.url, "appendfsync", "no")
    # Refused by the wait (the AOF stopped keeping up with this connection's writes) or by the
    # policy read after the write, whichever the server shows first.
    refused = r"not confirmed on the server.s disk within 0\.3 s|under the server's appendfsync no"
    with pytest.raises(NotDurableError, match=refused):
        durable.submit(tenant, USER, "support", GOAL, {}, queue=queue)
    _set(aof_server.url, "appendfsync", "always")
    assert durable.submit(tenant, USER, "support", GOAL, {}, queue=queue)
    # AOF switched off (and on again: until its first rewrite is done the server does not
    # count its fsyncs): the WAITAOF sent before each write refuses it.
    _set(aof_server.url, "appendonly", "no")
    with pytest.raises(NotDurableError, match=r"cannot be confirmed: .*appendonly"):
        durable.submit(tenant, USER, "support", GOAL, {}, queue=queue)
    _set(aof_server.url, "appendonly", "yes")
    admin = redis.Redis.from_url(aof_server.url)

    def rewritten() -> bool:
        persistence = admin.info("persistence")
        return (
            not persistence["aof_rewrite_in_progress"] and not persistence["aof_rewrite_scheduled"]
        )

    wait_until(rewritten, timeout_s=10)
    admin.close()
    assert durable.submit(tenant, USER, "support", GOAL, {}, queue=queue)
    assert _runs(aof_server.url, tenant) == 6  # the refused ones were written, not confirmed


def test_durable_modes_refuse_to_start_a_worker_or_a_command(
    aof_server: EmbeddedServer, own_server: EmbeddedServer, unique: str
) -> None:
    """A worker (as Celery starts it, and as `turnstile worker` does) and a CLI command asking
    a durable mode of a server that cannot give it exit non-zero with one line naming the
    setting to change, and write nothing."""
    _set(aof_server.url, "appendfsync", "everysec")
    worker = WorkerProcess(aof_server.url, [f"q-{unique}"], name=f"refused-{unique}",
                           env={"TURNSTILE_DURABILITY": "aof"}).start()  # fmt: skip
    assert worker.process is not None
    assert worker.process.wait(30) != 0
    lines = [line for line in worker.log().splitlines() if "TURNSTILE_DURABILITY" in line]
    assert lines == [
        "error: TURNSTILE_DURABILITY=aof needs the server's appendfsync always (it is everysec: "
        f"under it {_server_name(aof_server.url)} may confirm a write before its fsync, the "
        "bug Redis PR #13793 fixes): set appendfsync always on the server"
    ], worker.log()[-2000:]
    env = {k: v for k, v in os.environ.items() if not k.startswith("TURNSTILE_")}
    env["TURNSTILE_DURABILITY"] = "replica"
    started = subprocess.run(
        [TURNSTILE, "worker", "--redis-url", own_server.url, "-Q", f"q-{unique}"],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert started.returncode == 2
    assert started.stderr.strip().splitlines() == [
        "error: TURNSTILE_DURABILITY=replica needs 1 replica(s) following the server, and 0 "
        "is: start one (replicaof <host> <port>), lower TURNSTILE_DURABILITY_REPLICAS, or set "
        "TURNSTILE_DURABILITY=none"
    ], started.stderr
    result = CliRunner().invoke(
        app, ["submit", "--job", "support", "--tenant", f"t-{unique}", "--user", USER,
              "--goal", GOAL],
        env={"TURNSTILE_REDIS_URL": own_server.url, "TURNSTILE_DURABILITY": "aof"},
    )  # fmt: skip
    assert result.exit_code == 1, result.output
    assert result.stderr.count("\n") == 1
    assert "needs the server's appendonly yes (it is no)" in result.stderr
    assert _runs(own_server.url, f"t-{unique}") == 0


def _server_name(url: str) -> str:
    client = redis.Redis.from_url(url, decode_responses=True)
    try:
        info: dict[str, Any] = client.info("server")
        return f"{info['server_name']} {info['valkey_version']}"
    finally:
        client.close()


def test_replica_durability_waits_for_the_replicas(own_server: EmbeddedServer, unique: str) -> None:
    """With durability `replica`, a client is refused at its start while no replica follows
    the server; once one does, submissions are acknowledged and the replica holds them; a
    submission after the replica left is an error the caller sees."""
    queue, tenant = f"idle-{unique}", f"t-{unique}"
    _refused(own_server.url, "replica", r"needs 1 replica\(s\) following the server, and 0 is")
    with EmbeddedServer() as replica:
        follower = redis.Redis.from_url(replica.url)
        follower.replicaof("127.0.0.1", own_server.port)
        primary = redis.Redis.from_url(own_server.url)
        # Synced, as the replica sees it, and online, as the primary does (its first ack).
        wait_until(
            lambda: (
                follower.info("replication").get("master_link_status") == "up"
                and primary.info("replication").get("slave0", {}).get("state") == "online"
            ),
            what="the replica to sync",
        )
        primary.close()
        durable = client_for(own_server.url, durability="replica", durability_timeout_s=0.3)
        durable.submit(tenant, USER, "support", GOAL, {}, queue=queue)
        assert _runs(replica.url, tenant) == 1
        follower.replicaof("NO", "ONE")
        follower.close()
        with pytest.raises(NotDurableError, match="confirmed by 0 of 1 replica"):
            durable.submit(tenant, USER, "support", GOAL, {}, queue=queue)
        assert _runs(own_server.url, tenant) == 2  # written, just not confirmed


def _outcome(client: Any, run_id: str) -> tuple[str, str]:
    stored = client.run_hash(run_id)[1]
    return stored["status"], stored.get("outcome", "")


# In the serial part: a server killed under a live worker, whose recovery (reconnect, sweep)
# missed its 60 s beside three other test processes on two cores, and takes 9 s alone.
@pytest.mark.slow
def test_a_killed_server_keeps_every_acknowledged_write(
    aof_server: EmbeddedServer, unique: str
) -> None:
    """With durability `aof`, the server is SIGKILLed right after acknowledged submissions,
    approvals and denials (its tenant paused first) and restarted on the same AOF directory:
    every acknowledged run, decision, outcome and flag an observer saw is still there, and
    the approved runs complete once the tenant is resumed."""
    queue, idle, tenant = f"dur-{unique}", f"idle-{unique}", f"t-{unique}"
    env = {"TURNSTILE_DURABILITY": "aof"}
    client = client_for(aof_server.url, durability="aof")
    g = BY_LETTER["G"].params
    with running_workers(aof_server.url, [queue], 1, env=env, concurrency=2) as (worker,):
        held = [client.submit(tenant, USER, "support", GOAL, g, queue=queue) for _ in range(4)]
        plain = [client.submit(tenant, USER, "support", GOAL, {}, queue=queue) for _ in range(4)]
        wait_until(
            lambda: (
                all(_outcome(client, r)[0] == "suspended" for r in held)
                and all(_outcome(client, r)[0] == "stopped" for r in plain)
            ),
            what="runs to suspend or end",
        )
        seen = {r: _outcome(client, r) for r in plain}  # what an observer was shown
        # The tenant paused first, so no turn of an approved run is cut by the kill: a kill
        # in the middle of one would fail its approved call (an observation for the model,
        # which asks again: a new approval) instead of testing what the server keeps.
        flags.pause(client, Subject(tenant=tenant), by="ann")
        denied = [client.deny(r, by="ann", reason="no").outcome for r in held[:2]]
        assert denied == ["approval_denied", "approval_denied"]
        for run_id in held[2:]:
            client.approve(run_id, by="ann")
        late = [client.submit(tenant, USER, "support", GOAL, {}, queue=idle) for _ in range(5)]
        aof_server.kill()  # right after the last acknowledgement
        aof_server.start()

        after = client_for(aof_server.url)
        assert {r: _outcome(after, r) for r in plain} == seen
        for run_id, kind in zip(held, ["denied"] * 2 + ["approved"] * 2, strict=True):
            decisions = after.state(run_id).decisions
            assert [(d.kind, d.by) for d in decisions] == [(kind, "ann")]
        for run_id in held[:2]:
            assert _outcome(after, run_id) == ("stopped", "approval_denied")
        for run_id in late:
            assert _outcome(after, run_id) == ("running", "")
        assert _runs(aof_server.url, tenant) == len(held) + len(plain) + len(late)
        assert controls.tenant_paused(after.client, tenant)  # the pause was acknowledged too
        flags.resume(after, Subject(tenant=tenant), by="ann")
        # The worker reconnects (Celery's broker backoff), the sweeper re-sends what the kill
        # lost: seconds alone, more after the other drills of the serial part.
        wait_until(
            lambda: all(_outcome(after, r) == ("stopped", "completed") for r in held[2:]),
            timeout_s=120,
            what=lambda: (
                f"the approved runs to complete after the restart: "
                f"{[_outcome(after, r) for r in held[2:]]}; worker log: {worker.log()[-3000:]}"
            ),
        )
    for run_id in late:
        after.store.fail_run(tenant, run_id, "the test is over")


def test_an_observer_is_shown_only_what_is_durable(aof_server: EmbeddedServer, unique: str) -> None:
    """With durability `aof`, `status` and `runs` show what they read only once it is on the
    server's disk: with the server no longer fsyncing they fail in one line (refused at their
    start), and a reader started before the change fails its fence, instead of showing a
    state that a crash could take back."""
    tenant = f"t-{unique}"
    client = client_for(aof_server.url, durability="aof", durability_timeout_s=0.3)
    run_id = client.submit(tenant, USER, "support", GOAL, {}, queue=f"idle-{unique}")
    env = {"TURNSTILE_REDIS_URL": aof_server.url, "TURNSTILE_DURABILITY": "aof",
           "TURNSTILE_DURABILITY_TIMEOUT_S": "0.3"}  # fmt: skip
    runner = CliRunner()
    assert runner.invoke(app, ["status", run_id], env=env).exit_code == 0
    _set(aof_server.url, "appendfsync", "no")
    for args in (["status", run_id], ["runs", "--tenant", tenant]):
        result = runner.invoke(app, args, env=env)
        assert result.exit_code == 1, result.output
        assert "needs the server's appendfsync always (it is no" in result.stderr
        assert result.stderr.count("\n") == 1
    # Refused by the wait (the AOF stopped keeping up with this connection's writes) or by the
    # policy read after the write, whichever the server shows first.
    refused = r"not confirmed on the server.s disk within 0\.3 s|under the server's appendfsync no"
    with pytest.raises(NotDurableError, match=refused):
        client.store.fence("the runs read are")  # a reader started before the change


def test_durable_writes_load_the_scripts_a_server_lost(
    aof_server: EmbeddedServer, unique: str
) -> None:
    """With durability `aof`, a submission and a decision's commit made after SCRIPT FLUSH (as
    after a restart or a failover) load their scripts again and are confirmed: the durable
    writes take the one NOSCRIPT path every pipeline of scripts takes."""
    tenant = f"t-{unique}"
    client = client_for(aof_server.url, durability="aof", durability_timeout_s=2.0)
    client.client.script_flush()
    submitted = client.submit_run(tenant, USER, "support", GOAL, {}, queue=f"idle-{unique}")
    assert submitted.created
    client.client.script_flush()
    assert client.cancel(submitted.run_id, by="op") == "cancelled"
    assert _outcome(client, submitted.run_id) == ("stopped", "cancelled")
