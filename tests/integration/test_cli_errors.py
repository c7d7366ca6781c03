"""Every `turnstile` command, run as a real process: a server's error, a usage error or a bad
name is one line and a clear exit, never a traceback, and never a password; a broker that is
down does not fail a submission or a decision, which still happen."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid

import pytest
import redis
from typer.testing import CliRunner

from tests.integration.workers import client_for, running_workers, wait_until
from turnstile.jobs.support.scenarios import BY_LETTER, GOAL, USER
from turnstile.ledger import Ledger
from turnstile.worker.cli.main import app
from turnstile.worker.dev.embedded import EmbeddedServer, free_port
from turnstile.worker.store import keys

pytestmark = pytest.mark.integration

runner = CliRunner()


COMMAND_TIMEOUT_S = 60


def turnstile(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """The command as a user runs it: its own process, its own environment."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("TURNSTILE_")}
    return subprocess.run(
        [sys.executable, "-c", "from turnstile.worker.cli.main import main; main()", *args],
        env={**base, **env}, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False,
    )  # fmt: skip


def one_line(result: subprocess.CompletedProcess[str] | object, prefix: str = "error: ") -> str:
    """The single stderr line of a failed command (no traceback, no usage block)."""
    stderr = str(getattr(result, "stderr", ""))
    assert "Traceback" not in stderr and "╭" not in stderr, stderr
    assert stderr.startswith(prefix) and stderr.count("\n") == 1, stderr
    return stderr


# -- the server's errors, in every command ---------------------------------------------------

EVERY_COMMAND = [
    ["submit", "--job", "support", "--tenant", "t", "--user", "u", "--goal", "g"],
    ["runs"], ["status", "run_x"], ["approve", "run_x"], ["deny", "run_x", "--reason", "r"],
    ["cancel", "run_x"], ["pause", "--tenant", "t"], ["resume", "--tenant", "t"],
    ["drain", "--queue", "q"], ["queues"], ["watch", "run_x"], ["trace", "run_x"],
    ["replay", "run_x"], ["memory", "add", "--tenant", "t", "--user", "u", "--text", "hello"],
    ["memory", "list", "--tenant", "t"], ["memory", "forget", "--tenant", "t", "--user", "u"],
    ["ledger", "show", "t"], ["ledger", "set", "t", "steps=5"],
]  # fmt: skip


@pytest.mark.parametrize("args", EVERY_COMMAND, ids=[" ".join(a[:2]) for a in EVERY_COMMAND])
def test_every_command_says_a_server_error_in_one_line(redis_url: str, args: list[str]) -> None:
    """A store URL naming a database the server does not have: each command prints one line
    naming the server's error, and exits 1."""
    bad_db = redis_url.rsplit("/", 1)[0] + "/99"
    result = runner.invoke(app, args, env={"TURNSTILE_REDIS_URL": bad_db})
    assert result.exit_code == 1, result.output
    assert "DB index is out of range" in one_line(result)


def test_unreachable_and_refusing_servers_are_one_line_without_passwords(
    own_server: EmbeddedServer, unique: str
) -> None:
    """Connection refused, a wrong password, no password, a read-only replica: one line each,
    naming the store with its password masked."""
    dead = f"redis://:hunter2@127.0.0.1:{free_port()}/0"
    line = one_line(turnstile("runs", TURNSTILE_REDIS_URL=dead))
    assert "store unreachable at redis://:***@127.0.0.1" in line and "hunter2" not in line
    line = one_line(turnstile("status", "run_x", "--redis-url", "nonsense://:hunter2@x/0"))
    assert "bad store URL" in line and "hunter2" not in line

    admin = redis.Redis.from_url(own_server.url)
    admin.config_set("requirepass", "s3cret")
    try:
        wrong = f"redis://:wrong-pw@127.0.0.1:{own_server.port}/0"
        line = one_line(turnstile("queues", TURNSTILE_REDIS_URL=wrong))
        assert "refused the credentials" in line and "wrong-pw" not in line
        line = one_line(turnstile("queues", TURNSTILE_REDIS_URL=own_server.url))
        assert "refused the credentials" in line and "Authentication required" in line
    finally:
        admin.config_set("requirepass", "")

    admin.replicaof("127.0.0.1", free_port())  # a replica of nothing: it refuses writes
    try:
        result = turnstile("submit", "--job", "support", "--tenant", f"t-{unique}", "--user",
                           USER, "--goal", GOAL, TURNSTILE_REDIS_URL=own_server.url)  # fmt: skip
        assert result.returncode == 1
        assert "is read-only" in one_line(result)
    finally:
        admin.replicaof("NO", "ONE")
        admin.close()


# -- usage errors, bad names and consistent controls -----------------------------------------


def test_usage_errors_are_one_line(redis_url: str) -> None:
    """An unknown option, a missing one or an unknown command: `turnstile: <message>` on one
    line and exit 2, not click's boxed usage block."""
    result = turnstile("runs", "--bogus", TURNSTILE_REDIS_URL=redis_url)
    assert result.returncode == 2
    assert "No such option: --bogus" in one_line(result, "turnstile: ")
    result = turnstile("submit", "--user", "u", TURNSTILE_REDIS_URL=redis_url)
    assert result.returncode == 2 and "Missing option" in one_line(result, "turnstile: ")
    result = turnstile("frobnicate")
    assert result.returncode == 2 and "No such command" in one_line(result, "turnstile: ")


SUBMIT = ["submit", "--job", "support"]
BAD_NAMES = [
    [*SUBMIT, "--tenant=-acme", "--user", "u", "--goal", "g"],
    [*SUBMIT, "--tenant", "t-{u}", "--user=-u", "--goal", "g"],
    [*SUBMIT, "--tenant", "t-{u}", "--user", "u", "--goal", "g", "--queue=-q"],
    [*SUBMIT, "--tenant", "t-{u}", "--user", "u", "--goal", "g", "--run-id", ""],
    ["memory", "add", "--tenant=-acme", "--user", "u", "--text", "hello"],
    ["memory", "add", "--tenant", "t-{u}", "--user=-u", "--text", "hello"],
    ["pause", "--tenant=-acme"],
    ["drain", "--queue=-q"],
    ["ledger", "set", "--", "-acme", "steps=5"],
]


@pytest.mark.parametrize("args", BAD_NAMES, ids=[" ".join(a) for a in BAD_NAMES])
def test_names_starting_with_a_dash_and_empty_run_ids_are_refused(
    redis_url: str, unique: str, args: list[str]
) -> None:
    """A tenant, user or queue named `-...` (which no command could name again) and an empty
    run id are refused with one line, and nothing is written."""
    client = redis.Redis.from_url(redis_url)
    before = set(client.smembers(keys.TENANTS)), set(client.smembers(keys.QUEUES))
    result = runner.invoke(
        app, [a.format(u=unique) for a in args], env={"TURNSTILE_REDIS_URL": redis_url}
    )
    assert result.exit_code == 1, result.output
    line = one_line(result)
    assert "may not start with '-'" in line or "bad run id ''" in line, line
    assert (set(client.smembers(keys.TENANTS)), set(client.smembers(keys.QUEUES))) == before
    assert not client.exists(keys.memory_users("-acme"), keys.memory_users(f"t-{unique}"))
    with Ledger.from_url(redis_url) as ledger:
        assert ledger.read(f"t-{unique}") == {}
    client.close()


def test_ledger_set_checks_every_pair_before_writing(redis_url: str, unique: str) -> None:
    """`ledger set T steps=5 bogus=7` refuses `bogus` and writes nothing, not even `steps`."""
    result = runner.invoke(
        app, ["ledger", "set", unique, "steps=5", "bogus=7"], env={"TURNSTILE_REDIS_URL": redis_url}
    )
    assert result.exit_code == 1
    assert "unknown dimension 'bogus'" in one_line(result)
    with Ledger.from_url(redis_url) as ledger:
        assert ledger.read(unique) == {}


def test_a_second_pause_and_a_second_resume_both_change_nothing(
    redis_url: str, unique: str
) -> None:
    """Pausing what is paused and resuming what is not paused both exit 0 with a line saying
    nothing changed."""
    tenant = f"t-{unique}"
    client = client_for(redis_url)
    run_id = client.submit(tenant, USER, "support", GOAL, {}, queue=f"idle-{unique}")
    env = {"TURNSTILE_REDIS_URL": redis_url}
    for verb in ("pause", "pause", "resume", "resume"):
        result = runner.invoke(app, [verb, "--tenant", tenant, "--by", "ann"], env=env)
        assert result.exit_code == 0, result.output
    assert "was not paused; no change" in result.stdout
    again = runner.invoke(app, ["pause", "--tenant", tenant, "--by", "ann"], env=env)
    assert again.exit_code == 0
    repeat = runner.invoke(app, ["pause", "--tenant", tenant, "--by", "ann"], env=env)
    assert "no change" in repeat.stdout
    client.store.fail_run(tenant, run_id, "the test is over")


# -- a broker that is down -----------------------------------------------------------------


@pytest.mark.slow  # over 10 s on 2 cores: CI runs it in the slow part
def test_a_submit_and_an_approve_with_the_broker_down_are_accepted_and_happen(
    redis_url: str, unique: str
) -> None:
    """With the broker URL on a dead port and the store up, `submit` and `approve` exit 0
    within seconds, saying the step will be sent when the broker is back; the sweeper sends
    it, and the run suspends, is approved and completes. (With fair share off: with it on, a
    submission queues its step in the store, and the broker is the dispatcher's business; see
    tests/integration/test_fair.py.)"""
    queue, tenant = f"nb-{unique}", f"t-{unique}"
    g = BY_LETTER["G"].params
    down = {"TURNSTILE_REDIS_URL": redis_url, "TURNSTILE_PICKUP_LEASE_S": "3",
            "TURNSTILE_BROKER_URL": f"redis://127.0.0.1:{free_port()}/0",
            "TURNSTILE_FAIR_SHARE": "0"}  # fmt: skip
    client = client_for(redis_url)
    with running_workers(redis_url, [queue], 1):
        started = time.monotonic()
        result = turnstile(
            "submit", "--job", "support", "--tenant", tenant, "--user", USER, "--goal", GOAL,
            "--queue", queue, "--param", f"order={g['order']}",
            "--param", f"amount_cents={g['amount_cents']}", "--json", **down,
        )  # fmt: skip
        assert time.monotonic() - started < 20
        assert result.returncode == 0, result.stderr
        made = json.loads(result.stdout)
        assert made["created"] and not made["sent"]
        assert "the step will be sent when the broker is back" in result.stderr
        run_id = made["run_id"]
        wait_until(lambda: client.run_hash(run_id)[1]["status"] == "suspended",
                   what="the sweeper to send the step and the run to suspend")  # fmt: skip

        result = turnstile("approve", run_id, "--by", "ann", **down)
        assert result.returncode == 0, result.stderr
        assert "accepted; the step will be sent when the broker is back" in result.stdout
        assert "Traceback" not in result.stderr
        wait_until(lambda: client.run_hash(run_id)[1]["status"] == "stopped",
                   what="the approved run to finish")  # fmt: skip
    assert client.state(run_id).outcome == "completed"


def test_a_submit_with_the_broker_down_is_idempotent_on_its_run_id(
    redis_url: str, unique: str
) -> None:
    """Submitting the same run id again after a deferred send neither fails nor makes a
    second run (fair share off: with it on, the step is queued in the store)."""
    dead = f"redis://127.0.0.1:{free_port()}/0"
    client = client_for(redis_url, broker_url=dead, fair_share=False)
    run_id = f"run_{uuid.uuid4().hex[:12]}"
    first = client.submit_run(f"t-{unique}", USER, "support", GOAL, queue=f"idle-{unique}",
                              run_id=run_id)  # fmt: skip
    second = client.submit_run(f"t-{unique}", USER, "support", GOAL, queue=f"idle-{unique}",
                               run_id=run_id)  # fmt: skip
    assert (first.created, first.sent, second.created) == (True, False, False)
    assert client.deferred == [run_id]
    client.store.fail_run(f"t-{unique}", run_id, "the test is over")
