"""TURNSTILE_DURABILITY: acknowledged submissions, decisions and commits wait for the disk
(`aof`) or the replicas (`replica`); a wait that falls short is an error the caller sees; and
a server killed right after acknowledgements loses none of them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis
from typer.testing import CliRunner

from tests.integration.workers import client_for, running_workers, wait_until
from turnstile.jobs.support.scenarios import BY_LETTER, GOAL, USER
from turnstile.worker.cli.main import app
from turnstile.worker.dev.embedded import EmbeddedServer
from turnstile.worker.store.runs import NotDurableError

pytestmark = pytest.mark.integration


@pytest.fixture
def aof_server() -> Iterator[EmbeddedServer]:
    """A server of this test's own, with AOF on and `appendfsync everysec`, as production."""
    with EmbeddedServer(appendonly=True) as server:
        yield server


def _runs(url: str, tenant: str) -> int:
    client = redis.Redis.from_url(url)
    try:
        return int(client.zcard(f"turnstile:{{{tenant}}}:runs"))
    finally:
        client.close()


def test_aof_durability_refuses_an_unconfirmed_write(
    aof_server: EmbeddedServer, own_server: EmbeddedServer, unique: str
) -> None:
    """With durability `aof`, a submission the disk does not confirm within the timeout (the
    server not fsyncing) is an error the caller sees, and so is one to a server without AOF;
    with fsync every second it is acknowledged."""
    queue = f"idle-{unique}"
    durable = client_for(aof_server.url, durability="aof", durability_timeout_s=0.3)
    assert durable.submit(f"t-{unique}", USER, "support", GOAL, {}, queue=queue)

    redis.Redis.from_url(aof_server.url).config_set("appendfsync", "no")
    with pytest.raises(NotDurableError, match=r"not confirmed on the server.s disk within 0\.3 s"):
        durable.submit(f"t-{unique}", USER, "support", GOAL, {}, queue=queue)

    no_aof = client_for(own_server.url, durability="aof", durability_timeout_s=0.3)
    with pytest.raises(NotDurableError, match="appendonly is disabled"):
        no_aof.submit(f"t-{unique}", USER, "support", GOAL, {}, queue=queue)
    plain = client_for(own_server.url)  # durability none: acknowledged from memory, as before
    assert plain.submit(f"t-{unique}", USER, "support", GOAL, {}, queue=queue)


def test_replica_durability_waits_for_the_replicas(own_server: EmbeddedServer, unique: str) -> None:
    """With durability `replica`, a submission no replica confirms is an error the caller
    sees; once a replica follows the server, submissions are acknowledged and the replica
    holds them."""
    queue, tenant = f"idle-{unique}", f"t-{unique}"
    durable = client_for(own_server.url, durability="replica", durability_timeout_s=0.3)
    with pytest.raises(NotDurableError, match="confirmed by 0 of 1 replica"):
        durable.submit(tenant, USER, "support", GOAL, {}, queue=queue)
    with EmbeddedServer() as replica:
        follower = redis.Redis.from_url(replica.url)
        follower.replicaof("127.0.0.1", own_server.port)
        wait_until(
            lambda: follower.info("replication").get("master_link_status") == "up",
            what="the replica to sync",
        )
        durable = client_for(own_server.url, durability="replica", durability_timeout_s=3)
        durable.submit(tenant, USER, "support", GOAL, {}, queue=queue)
        assert _runs(replica.url, tenant) == 2  # the refused one was written, just not confirmed
        follower.close()


def _outcome(client: Any, run_id: str) -> tuple[str, str]:
    stored = client.run_hash(run_id)[1]
    return stored["status"], stored.get("outcome", "")


def test_a_killed_server_keeps_every_acknowledged_write(
    aof_server: EmbeddedServer, unique: str
) -> None:
    """With durability `aof`, the server is SIGKILLed right after acknowledged submissions,
    approvals and denials and restarted on the same AOF directory: every acknowledged run,
    decision and outcome an observer saw is still there."""
    queue, idle, tenant = f"dur-{unique}", f"idle-{unique}", f"t-{unique}"
    env = {"TURNSTILE_DURABILITY": "aof"}
    client = client_for(aof_server.url, durability="aof")
    g = BY_LETTER["G"].params
    with running_workers(aof_server.url, [queue], 1, env=env, concurrency=2):
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
        wait_until(
            lambda: all(_outcome(after, r) == ("stopped", "completed") for r in held[2:]),
            what="the approved runs to complete after the restart",
        )
    for run_id in late:
        after.store.fail_run(tenant, run_id, "the test is over")


def test_an_observer_is_shown_only_what_is_durable(aof_server: EmbeddedServer, unique: str) -> None:
    """With durability `aof`, `status` and `runs` show what they read only once it is on the
    server's disk: with the disk not confirming, they fail in one line instead of showing a
    state that a crash could take back."""
    tenant = f"t-{unique}"
    client = client_for(aof_server.url, durability="aof")
    run_id = client.submit(tenant, USER, "support", GOAL, {}, queue=f"idle-{unique}")
    env = {"TURNSTILE_REDIS_URL": aof_server.url, "TURNSTILE_DURABILITY": "aof",
           "TURNSTILE_DURABILITY_TIMEOUT_S": "0.3"}  # fmt: skip
    runner = CliRunner()
    assert runner.invoke(app, ["status", run_id], env=env).exit_code == 0
    redis.Redis.from_url(aof_server.url).config_set("appendfsync", "no")
    for args in (["status", run_id], ["runs", "--tenant", tenant]):
        result = runner.invoke(app, args, env=env)
        assert result.exit_code == 1, result.output
        assert "not confirmed on the server's disk within 0.3 s" in result.stderr
        assert result.stderr.count("\n") == 1
