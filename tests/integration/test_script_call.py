"""A script called on its own (`scripts.call_script`): what redis-py's `Script` answers and
raises, without redis-py's per-command path, on a pool of one connection as a worker's step
services bound theirs (a connection not given back would leave the next call waiting). And a
pipeline calling scripts (`scripts.with_scripts`): what redis-py's pipeline answers, without
its path, on the same pool."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from turnstile.worker.dev.embedded import EmbeddedServer
from turnstile.worker.store.connect import connect_with_timeout
from turnstile.worker.store.scripts import call_script, evalsha, with_scripts

ECHO = "return {KEYS[1], ARGV[1], tonumber(ARGV[2]) + 1, {1, 'a'}, false}"


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    client = connect_with_timeout(redis_url, 1.0, max_connections=1)
    yield client
    client.close()


def _counting(client: redis.Redis) -> list[Any]:
    """The commands sent through the client's own command path from now on."""
    sent: list[Any] = []
    original: Callable[..., Any] = client.execute_command

    def counted(*args: Any, **options: Any) -> Any:
        sent.append(args[0])
        return original(*args, **options)

    client.execute_command = counted  # type: ignore[method-assign]
    return sent


def test_a_call_answers_what_redis_py_answers(client: redis.Redis, unique: str) -> None:
    """The reply, decoded as the client decodes, is the one redis-py's `Script` gives, and it
    is sent without the client's command path (which `Script` goes through)."""
    script = client.register_script(ECHO)
    expected = script(keys=[f"k:{unique}"], args=["é", 41])
    sent = _counting(client)
    for _ in range(3):  # the one connection goes back to the pool each time
        assert call_script(client, script, [f"k:{unique}"], ["é", 41]) == expected
    assert expected == [f"k:{unique}", "é", 42, [1, "a"], None]
    assert sent == []
    script(keys=[f"k:{unique}"], args=["é", 41])
    assert sent == ["EVALSHA"]


def test_an_error_of_the_script_is_raised_as_redis_py_raises_it(
    client: redis.Redis, unique: str
) -> None:
    """An error the script returns is the caller's ResponseError, with the script's words; the
    connection is whole after it."""
    failing = client.register_script("return redis.error_reply('refused: ' .. ARGV[1])")
    with pytest.raises(redis.ResponseError, match="refused: no"):
        call_script(client, failing, [f"k:{unique}"], ["no"])
    echo = client.register_script(ECHO)
    assert call_script(client, echo, [f"k:{unique}"], ["x", 1])[2] == 2


def test_a_script_the_server_lost_is_loaded_and_called_again(own_server: EmbeddedServer) -> None:
    """After SCRIPT FLUSH (a restart, a failover), the call loads the script and answers."""
    client = connect_with_timeout(own_server.url, 1.0, max_connections=1)
    try:
        script = client.register_script(ECHO)
        assert call_script(client, script, ["k"], ["a", 1])[2] == 2
        client.script_flush()
        assert call_script(client, script, ["k"], ["b", 2])[1:3] == ["b", 3]
        assert client.script_exists(script.sha) == [True]
    finally:
        client.close()


def test_a_connection_the_server_closed_is_replaced(own_server: EmbeddedServer) -> None:
    """The pool's connection killed by the server between two calls: the next call reconnects
    (the connection's own Retry, as redis-py's commands do) and answers."""
    client = connect_with_timeout(own_server.url, 1.0, max_connections=1)
    killer = redis.Redis.from_url(own_server.url)
    try:
        script = client.register_script(ECHO)
        assert call_script(client, script, ["k"], ["a", 1])[2] == 2
        assert int(killer.client_kill_filter(_type="normal", skipme=True)) >= 1
        assert call_script(client, script, ["k"], ["b", 2])[2] == 3
    finally:
        client.close()
        killer.close()


def test_a_client_on_one_connection_calls_through_redis_py(redis_url: str, unique: str) -> None:
    """A client that holds a single connection of its own (redis-py's `single_connection_client`,
    with its lock) has its script called the way redis-py calls it."""
    client = redis.Redis.from_url(redis_url, decode_responses=True, single_connection_client=True)
    try:
        script = client.register_script(ECHO)
        client.script_load(ECHO)  # known to the server: the call is one EVALSHA
        sent = _counting(client)
        assert call_script(client, script, [f"k:{unique}"], ["x", 1])[2] == 2
        assert sent == ["EVALSHA"]
    finally:
        client.close()


def _build(script: Any, key: str) -> Callable[[Any], None]:
    def build(pipe: Any) -> None:
        evalsha(pipe, script, [key], ["é", 41])
        pipe.exists(key + ":h")
        pipe.hmget(key + ":h", "a", "b")
        pipe.zrem(key + ":z", "nobody")
        pipe.incr(key + ":h")  # WRONGTYPE: an error, in its place or raised

    return build


def test_a_pipeline_answers_what_redis_py_answers(client: redis.Redis, unique: str) -> None:
    """The replies, each decoded and given its response callback as redis-py gives them, with
    an error in its place (`raise_on_error=False`) or raised; none through the client's own
    command path; the one connection given back each time."""
    script = client.register_script(ECHO)
    client.script_load(ECHO)
    key = f"k:{unique}"
    client.hset(key + ":h", "a", "1")
    pipe = client.pipeline(transaction=False)
    _build(script, key)(pipe)
    expected = pipe.execute(raise_on_error=False)
    sent = _counting(client)
    for _ in range(3):
        got = with_scripts(client, (script,), _build(script, key), raise_on_error=False)
        assert got[:4] == expected[:4] == [[key, "é", 42, [1, "a"], None], 1, ["1", None], 0]
        assert type(got[4]) is type(expected[4]) is redis.ResponseError
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        with_scripts(client, (script,), _build(script, key))
    assert sent == []


def test_a_pipeline_reloads_lost_scripts_and_survives_a_killed_connection(
    own_server: EmbeddedServer,
) -> None:
    """After SCRIPT FLUSH the pipeline loads its scripts and runs again; a connection the
    server closed between two pipelines is replaced (the connection's own Retry)."""
    client = connect_with_timeout(own_server.url, 1.0, max_connections=1)
    killer = redis.Redis.from_url(own_server.url)
    try:
        script = client.register_script(ECHO)

        def build(pipe: Any) -> None:
            evalsha(pipe, script, ["k"], ["a", 1])
            pipe.hmget("h", "a")

        assert with_scripts(client, (script,), build) == [["k", "a", 2, [1, "a"], None], [None]]
        client.script_flush()
        assert with_scripts(client, (script,), build)[0][2] == 2
        assert int(killer.client_kill_filter(_type="normal", skipme=True)) >= 1
        assert with_scripts(client, (script,), build)[0][2] == 2
    finally:
        client.close()
        killer.close()
