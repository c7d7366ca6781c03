"""A queue's backlog as the HTTP API gives it to an autoscaler, with a real worker and the real
API server: while runs wait behind a busy worker, `GET /v1/queues/{queue}/backlog` counts the
steps in the tenants' pending lists, on the broker and in flight exactly as the store holds
them, one per live run, and it falls to zero when they finish."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from tests.integration.apiserver import http, make_key, running_api
from tests.integration.workers import client_for, running_workers, settled, wait_until
from turnstile.jobs.support.scenarios import GOAL, USER
from turnstile.worker.broker import layout
from turnstile.worker.http.apikeys import Role
from turnstile.worker.store import keys

pytestmark = pytest.mark.integration

TURN_S = 0.8  # each model call really sleeps this long: the worker stays busy
RUNS_PER_TENANT = 4


def counted_in_the_store(r: redis.Redis, tenants: list[str], queue: str) -> dict[str, int]:
    """The queue's steps read key by key, not through the code under test: every pending list
    of the tenants, every broker list of the queue, and the tenants' in-flight entries on the
    queue whose lease is still running."""
    pending = sum(
        int(r.zcard(keys.pending(t, queue, kind))) for t in tenants for kind in ("cont", "start")
    )
    on_broker = sum(int(r.llen(name)) for name in layout.priority_lists(queue))
    seconds, micros = r.time()
    now_ms = int(seconds) * 1000 + int(micros) // 1000
    in_flight = 0
    for tenant in tenants:
        for value in r.hvals(keys.inflight(tenant)):
            fields = str(value).split("|")
            in_flight += fields[0] == queue and int(fields[-1]) > now_ms
    return {"pending": pending, "on_broker": on_broker, "in_flight": in_flight}


def running(r: redis.Redis, tenants: list[str], run_ids: dict[str, str]) -> int:
    """Our runs that are live with a step to take (not finished, not waiting for a person)."""
    return sum(r.hget(keys.run(t, run_id), "status") == "running" for run_id, t in run_ids.items())


@pytest.mark.slow  # over 14 s on 2 cores: CI runs it in the slow part
def test_the_backlog_is_what_waits_and_runs_and_falls_to_zero(redis_url: str, unique: str) -> None:
    """Two tenants' runs on one worker of 2 slots, the dispatcher keeping one step on the
    broker: the endpoint's figures equal the store's own counts (read before and after it,
    unchanged), the backlog is one step per live run with some pending and some in flight,
    and when every run has finished the backlog is 0. A service key is refused (403), an
    unknown queue is a 404."""
    queue = f"backlog-{unique}"
    tenants = [f"bl-a-{unique}", f"bl-b-{unique}"]
    client = client_for(redis_url)
    r = redis.Redis.from_url(redis_url, decode_responses=True)
    env = {"TURNSTILE_DISPATCH_DEPTH": "1"}
    seen: dict[str, Any] = {}
    with (
        running_workers(redis_url, [queue], 1, env=env, prefix="bl", concurrency=2) as _,
        running_api(redis_url) as api,
        http(api, make_key(redis_url, f"ops-{unique}", Role.OPERATOR)) as op,
    ):
        run_ids = {
            client.submit(t, USER, "support", GOAL, {"model_sleep_s": TURN_S}, queue=queue): t
            for _ in range(RUNS_PER_TENANT)
            for t in tenants
        }

        def agrees() -> bool:
            before = counted_in_the_store(r, tenants, queue)
            reply = op.get(f"/v1/queues/{queue}/backlog")
            after = counted_in_the_store(r, tenants, queue)
            live = running(r, tenants, run_ids)
            assert reply.status_code == 200, reply.text
            seen.update(reply=reply.json(), store=after, live=live)
            body = reply.json()
            if before != after or any(body[k] != after[k] for k in after):
                return False  # a step moved while we read: read again
            assert body["queue"] == queue
            assert body["waiting"] == body["pending"] + body["on_broker"]
            assert body["backlog"] == body["waiting"] + body["in_flight"]
            # Every live run has exactly one step somewhere, so the backlog counts the runs;
            # wait for a moment with steps both pending and running.
            return bool(body["backlog"] == live and body["pending"] and body["in_flight"])

        wait_until(agrees, timeout_s=90, what=lambda: f"last seen: {seen}")
        assert seen["reply"]["in_flight"] <= 2  # the worker's slots
        print(f"backlog while busy: {seen['reply']} ({seen['live']} live runs)")

        wait_until(lambda: settled(client, list(run_ids)), timeout_s=240, what="runs finished")
        done = op.get(f"/v1/queues/{queue}/backlog").json()
        assert done == {"queue": queue, "pending": 0, "on_broker": 0, "waiting": 0,
                        "in_flight": 0, "backlog": 0}  # fmt: skip

        unknown = op.get(f"/v1/queues/nothing-{unique}/backlog")
        assert unknown.status_code == 404 and "unknown queue" in unknown.json()["detail"]
        with http(api, make_key(redis_url, tenants[0])) as service:
            refused = service.get(f"/v1/queues/{queue}/backlog")
        assert refused.status_code == 403 and refused.json()["code"] == "operator_only"
