"""redis-py's metric hooks in a worker's processes (worker/store/connect.py
`quiet_redis_hooks`): with its OpenTelemetry metrics off, a command no longer looks for a
collector, and commands answer as before. Each case runs in a process of its own: the hooks
are the process's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import cast

import pytest
import redis

from turnstile.worker.dev.embedded import EmbeddedServer
from turnstile.worker.runtime.hooks import RedisHooksHook, worker_hooks
from turnstile.worker.runtime.services import WorkerServices
from turnstile.worker.settings import Settings
from turnstile.worker.store.connect import (
    UNNAMED,
    connect_with_timeout,
    driver_info,
    open_connection,
)

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import json, sys
from redis.observability import recorder
from turnstile.worker.store.connect import connect_with_timeout, quiet_redis_hooks

looked = [0]
find = recorder._get_or_create_collector

def counted():
    looked[0] += 1
    return find()

recorder._get_or_create_collector = counted
client = connect_with_timeout(sys.argv[1], 5.0, max_connections=2)
replaced = quiet_redis_hooks() if sys.argv[2] == "quiet" else []
looked[0] = 0
script = client.register_script("return ARGV[1]")
answers = [client.set(sys.argv[3], "v"), client.get(sys.argv[3]), script(keys=["k"], args=["x"])]
pipe = client.pipeline(transaction=False)
pipe.incr(sys.argv[3] + ":n")
pipe.get(sys.argv[3])
answers += pipe.execute()
client.close()
print(json.dumps({"replaced": replaced, "looked": looked[0], "answers": answers}))
"""


def _probe(redis_url: str, mode: str, key: str) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, redis_url, mode, key],
        capture_output=True, text=True, timeout=120, cwd=ROOT, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    probe: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return probe


def test_quieted_hooks_look_for_no_collector_and_commands_answer_the_same(
    redis_url: str, unique: str
) -> None:
    """As redis-py comes, every command looks for a metrics collector (none is set); quieted,
    none does, and a command, a script call and a pipeline answer what they answered. The
    names replaced include the two every command calls: a redis-py that renamed them fails
    here, not silently."""
    before = _probe(redis_url, "as-is", f"hooks:{unique}:a")
    after = _probe(redis_url, "quiet", f"hooks:{unique}:b")
    assert isinstance(before["looked"], int) and before["looked"] >= 5
    assert after["looked"] == 0
    assert before["answers"] == after["answers"] == [True, "v", "x", 1, "v"]
    replaced = after["replaced"]
    assert isinstance(replaced, list)
    assert "redis.client.record_operation_duration" in replaced
    assert "redis.connection.record_connection_count" in replaced


def test_a_worker_quiets_the_hooks_as_it_starts() -> None:
    """The worker's hooks include the one that quiets redis-py's, at worker_init (before the
    pool forks)."""
    config = Settings(redis_url=None)
    hooks = worker_hooks(WorkerServices(config, app=None))  # type: ignore[arg-type]
    assert any(isinstance(h, RedisHooksHook) for h in hooks)


def test_a_store_client_tells_the_server_redis_py_s_name_and_version_read_once(
    redis_url: str,
) -> None:
    """Every connection of a store client says what redis-py's own would (CLIENT SETINFO), from
    one DriverInfo read when the first client was made, not from the package's metadata per
    connection."""
    ours = [connect_with_timeout(redis_url, 2.0, max_connections=bound) for bound in (None, 4)]
    plain = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        told = [client.client_info() for client in (*ours, plain)]
        assert {(info["lib-name"], info["lib-ver"]) for info in told} == {
            ("redis-py", redis.__version__)
        }
        for client in ours:  # redis-py's handshake tells nothing itself: no DriverInfo per
            conn = client.connection_pool.get_connection()  # connection, no metadata read
            try:
                assert conn.driver_info is UNNAMED
                # redis-py types the function as taking nothing; it is called with the connection
                assert cast(object, conn.redis_connect_func) is open_connection
            finally:
                client.connection_pool.release(conn)
        assert driver_info().lib_version == redis.__version__
    finally:
        for client in (*ours, plain):
            client.close()


def test_a_store_connection_opens_with_no_ping_and_keeps_its_auth_and_database() -> None:
    """A new connection of a store client (connect.py `open_connection`) opens with redis-py's
    handshake and no health-check PING before it: the server counts HELLO and the two CLIENT
    SETINFO (three commands) where redis-py with the same health check counts a PING more. A
    URL's user, password and database still hold (its own server: the test adds a user)."""
    with EmbeddedServer() as server:
        admin = redis.Redis.from_url(server.url, decode_responses=True)
        ours = connect_with_timeout(server.url, 2.0, max_connections=4)
        theirs = redis.Redis.from_url(server.url, decode_responses=True, health_check_interval=30)
        admin.acl_setuser("probe", enabled=True, passwords=["+s3cret"], keys=["*"],
                          commands=["+@all"])  # fmt: skip
        url = server.url.replace("redis://", "redis://probe:s3cret@") + "/2"
        signed = connect_with_timeout(url, 2.0, max_connections=4)
        wrong = connect_with_timeout(url.replace("s3cret", "wrong"), 2.0, max_connections=4)
        try:
            told = ours.client_info()
            assert told["tot-cmds"] == "3"  # HELLO, SETINFO twice (this one not yet counted)
            assert theirs.client_info()["tot-cmds"] == "4"  # the PING first
            assert (told["lib-name"], told["lib-ver"]) == ("redis-py", redis.__version__)
            told = signed.client_info()
            assert told["tot-cmds"] == "4"  # HELLO with AUTH, SELECT, SETINFO twice
            assert (told["user"], told["db"], told["lib-name"]) == ("probe", 2, "redis-py")
            signed.set("probe:key", "here")
            with redis.Redis.from_url(server.url + "/2", decode_responses=True) as db2:
                assert db2.get("probe:key") == "here"
            with pytest.raises(redis.AuthenticationError):
                wrong.ping()
        finally:
            for client in (ours, theirs, signed, wrong, admin):
                client.close()
