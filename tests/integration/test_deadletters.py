"""Bad entries on a queue, pushed straight onto the Redis broker's list, against a real worker
process: each goes to the dead letters with its reason, and the worker goes on."""

from __future__ import annotations

import base64
import json
import pickle
import uuid
from typing import Any

import pytest
import redis
from kombu import Connection
from typer.testing import CliRunner

from tests.integration.test_metrics import free_port, scrape, value
from tests.integration.workers import client_for, running_workers, settled, wait_until
from turnstile.jobs.support.scenarios import GOAL, USER
from turnstile.worker.broker import layout
from turnstile.worker.broker.message import STEP_TASK
from turnstile.worker.broker.transport import Channel, Transport
from turnstile.worker.cli.main import app
from turnstile.worker.store import keys

pytestmark = pytest.mark.integration


def envelope(queue: str, body: bytes, headers: Any, **props: Any) -> str:
    """kombu's Redis envelope around a body, as a producer writes it, with what a test breaks."""
    return json.dumps({
        "body": base64.b64encode(body).decode(),
        "content-encoding": "utf-8",
        "content-type": "application/json",
        "headers": headers,
        "properties": {
            "body_encoding": "base64", "delivery_tag": uuid.uuid4().hex, "priority": 0,
            "delivery_info": {"exchange": queue, "routing_key": queue}, **props,
        },
    })  # fmt: skip


def step_headers(**broken: Any) -> dict[str, Any]:
    return {"task": STEP_TASK, "id": uuid.uuid4().hex, "lang": "py", "retries": 0,
            "timelimit": [None, None], **broken}  # fmt: skip


ARGS = json.dumps([[], {"tenant": "t", "run_id": "run_x", "version": 1}, {}]).encode()

# One entry of each kind, with the reason it must be kept under.
BAD: dict[str, tuple[str, Any]] = {
    "not JSON": ("not_json", lambda q: b"\xff\x00 not a message"),
    "JSON of the wrong shape": ("bad_envelope", lambda q: json.dumps("just a string")),
    "an envelope without a delivery tag": (
        "bad_envelope", lambda q: envelope(q, ARGS, step_headers(), delivery_tag=None)),
    "headers that are not an object": ("bad_envelope", lambda q: envelope(q, ARGS, "headers")),
    "a time limit that is not two numbers": (
        "bad_headers", lambda q: envelope(q, ARGS, step_headers(timelimit="zz"))),
    "an eta that is not a time": (
        "bad_headers", lambda q: envelope(q, ARGS, step_headers(eta="tomorrow"))),
    "an unknown task name": (
        "unknown_task", lambda q: envelope(q, ARGS, step_headers(task="nobody.task"))),
    "base64 garbage for a body": (
        "bad_envelope",
        lambda q: envelope(q, ARGS, step_headers()).replace(
            base64.b64encode(ARGS).decode(), "!!not base64!!")),
    "a body that is not JSON": (
        "bad_body", lambda q: envelope(q, b"\x00\x01 not json", step_headers())),
    "a body that is not [args, kwargs, embed]": (
        "bad_body", lambda q: envelope(q, b'{"a": 1}', step_headers())),
    "a protocol-1 body with a broken time limit": (
        "bad_headers",
        lambda q: envelope(q, json.dumps({"task": STEP_TASK, "id": "p1", "args": [],
                                          "kwargs": {}, "timelimit": "zz"}).encode(), {})),
    "a pickled body (content that is never accepted)": (
        "bad_body",
        lambda q: envelope(q, pickle.dumps([[], {}, {}]), step_headers()).replace(
            '"application/json"', '"application/x-python-serialize"')),
    "no task header and a body that is not a task": (
        "unknown_format", lambda q: envelope(q, b'{"a": 1}', {})),
}  # fmt: skip


def test_a_worker_survives_any_bytes_on_its_queue(redis_url: str, unique: str) -> None:
    """Every kind of bad entry is moved to the queue's dead letters with its reason, one log
    line and one count in the metrics; the worker stays up and a run alongside completes;
    `turnstile queues` counts them and `turnstile dead-letters` lists and drops them."""
    queue, port = f"dl-{unique}", free_port()
    env = {"TURNSTILE_METRICS_PORT": str(port)}
    with running_workers(redis_url, [queue], 1, env=env) as (worker,):
        broker = redis.Redis.from_url(redis_url)
        for _, make in BAD.values():
            broker.lpush(layout.broker_queue(queue), make(queue))
        client = client_for(redis_url)
        run_id = client.submit(f"t-{unique}", USER, "support", GOAL, {}, queue=queue)
        wait_until(lambda: settled(client, [run_id]), timeout_s=60, what="the run ends")
        assert client.state(run_id).outcome == "completed"
        wait_until(lambda: len(worker.events("message_dead_lettered")) == len(BAD),
                   timeout_s=10, what="every bad entry dead-lettered")  # fmt: skip
        assert worker.process is not None and worker.process.poll() is None
        assert "Unrecoverable error" not in worker.log()
        samples = scrape(port)

    kept = [json.loads(e) for e in broker.lrange(keys.dead_letters(queue), 0, -1)]
    assert sorted(d["reason"] for d in kept) == sorted(reason for reason, _ in BAD.values())
    assert broker.llen(layout.broker_queue(queue)) == 0
    assert all(d["queue"] == queue for d in kept)  # the Turnstile queue, not the broker's
    not_json = next(d for d in kept if d["reason"] == "not_json")
    assert base64.b64decode(not_json["raw"]) == b"\xff\x00 not a message"
    for reason in {r for r, _ in BAD.values()}:
        expected = sum(r == reason for r, _ in BAD.values())
        assert value(samples, "turnstile_dead_letters_total", reason=reason) == expected, reason

    run = CliRunner().invoke
    base = {"TURNSTILE_REDIS_URL": redis_url}
    views = json.loads(run(app, ["queues", "--json"], env=base).stdout)
    assert next(v for v in views if v["name"] == queue)["dead_letters"] == len(BAD)
    listed = json.loads(run(app, ["dead-letters", "list", "--queue", queue, "--json"], env=base)
                        .stdout)  # fmt: skip
    assert {d["id"] for d in listed} == {d["id"] for d in kept}
    refused = run(app, ["dead-letters", "drop", "--queue", queue], env=base)
    assert refused.exit_code == 2 and refused.stderr.startswith("error: say which")
    missing = run(app, ["dead-letters", "drop", "--id", kept[0]["id"], "--id", "nope"], env=base)
    assert missing.exit_code == 1 and missing.stderr.count("\n") == 1, missing.output
    assert broker.llen(keys.dead_letters(queue)) == len(BAD)  # nothing dropped
    one = run(app, ["dead-letters", "drop", "--id", kept[0]["id"], "--json"], env=base)
    assert json.loads(one.stdout) == {"dropped": 1}
    rest = run(app, ["dead-letters", "drop", "--all", "--queue", queue],
               env={**base, "TURNSTILE_JSON": "1"})  # fmt: skip
    assert json.loads(rest.stdout) == {"dropped": len(BAD) - 1}
    assert broker.llen(keys.dead_letters(queue)) == 0


def test_the_channel_publishes_and_acks_on_one_client(redis_url: str) -> None:
    """kombu builds a new Redis client for every publish and every ack; the channel keeps one
    per pool instead, and messages published and acked through it still arrive and go."""
    queue = f"one-client-{uuid.uuid4().hex[:8]}"
    with Connection(redis_url, transport=Transport) as conn:
        channel = conn.default_channel
        assert isinstance(channel, Channel)
        with channel.conn_or_acquire() as first, channel.conn_or_acquire() as second:
            assert first is second
        simple = conn.SimpleQueue(queue)
        simple.put({"n": 1})
        simple.put({"n": 2})
        got = [simple.get(timeout=5) for _ in range(2)]
        for message in got:
            message.ack()
        assert sorted(m.payload["n"] for m in got) == [1, 2]
        simple.close()
        assert redis.Redis.from_url(redis_url).llen(queue) == 0
