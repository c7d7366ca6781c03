"""Queues between tenants, on a real Valkey server and real Celery workers: no queue name a
client gives reaches kombu's or Celery's keys on the broker (a name the broker reserves is
refused; a step on such a queue lies in Turnstile's namespace there, harming no worker); a
queue broken by hand is skipped while every other queue's dispatch goes on, and is shown
broken, never as a 500; who may submit to which queue is the operators' to say."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis
from kombu import Connection
from typer.testing import CliRunner

from tests.integration.apiserver import ApiServer, http, make_key, running_api
from tests.integration.rabbitmq import BROKERS, broker_for
from tests.integration.workers import (
    WorkerProcess,
    client_for,
    running_workers,
    settled,
    wait_until,
)
from turnstile.errors import QueueNotAllowedError, SubmissionNameError
from turnstile.jobs.support.scenarios import GOAL, USER
from turnstile.worker.broker import layout
from turnstile.worker.broker.message import StepMessage
from turnstile.worker.broker.producer import sender
from turnstile.worker.cli.main import app
from turnstile.worker.client._client import RUN_TENANTS, Client
from turnstile.worker.dev.embedded import EmbeddedServer
from turnstile.worker.http.apikeys import Role
from turnstile.worker.scheduling.fair import route
from turnstile.worker.store import keys

pytestmark = pytest.mark.integration

runner = CliRunner()


def _names_of_the_broker(queue: str) -> list[str]:
    """Queue names that are kombu's own keys on a Redis broker, or the binding of a worker's
    queue (by its name before the namespace, and by its broker name)."""
    return ["unacked", "unacked_index", "unacked_mutex", "_kombu.binding.default",
            f"_kombu.binding.{queue}", f"_kombu.binding.{layout.broker_queue(queue)}"]  # fmt: skip


def _alive(workers: list[WorkerProcess]) -> None:
    for worker in workers:
        assert worker.process is not None and worker.process.poll() is None, worker.log()[-2000:]
        assert "Unrecoverable error" not in worker.log(), worker.log()[-2000:]


def _completes(client: Client, tenant: str, queue: str, timeout_s: float = 90) -> str:
    run_id = client.submit(tenant, USER, "support", GOAL, {}, queue=queue)
    wait_until(lambda: settled(client, [run_id]), timeout_s=timeout_s,
               what=f"{tenant}'s run on {queue} ends")  # fmt: skip
    assert client.state(run_id).outcome == "completed"
    return run_id


def _nothing_written(client: Client, tenant: str, queue: str, run_id: str | None = None) -> None:
    """A refused submission left no tenant, no queue, no pending step and no run id behind."""
    r = client.client
    assert not r.sismember(keys.TENANTS, tenant)
    assert not r.sismember(keys.QUEUES, queue) and not r.sismember(keys.FAIR_QUEUES, queue)
    assert not r.exists(keys.pending(tenant, queue, "start"))
    if run_id is not None:
        assert r.hget(RUN_TENANTS, run_id) is None
        assert not r.exists(keys.run(tenant, run_id))


def _one_line_problem(reply: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert reply.status_code == status, reply.text
    assert reply.headers["content-type"].startswith("application/problem+json")
    problem: dict[str, Any] = reply.json()
    assert problem["code"] == code and "\n" not in problem["detail"], problem
    return problem


@pytest.fixture
def own_store() -> Iterator[str]:
    """A server of this test's own: what is done to the broker's keys here touches no other
    test's workers."""
    with EmbeddedServer() as server:
        yield server.url


@pytest.mark.parametrize("broker", BROKERS)
def test_a_queue_named_after_the_brokers_keys_is_refused_or_harmless(
    broker: str, own_store: str, unique: str
) -> None:
    """A submission to `unacked`, `unacked_index`, `unacked_mutex` or `_kombu.binding.*`
    (the client, the CLI, the HTTP API) is refused in one line with nothing written; steps
    put on those queues all the same (by a client from before the rule) are dispatched to
    Turnstile's namespace on the broker, where they touch none of kombu's keys: every worker
    stays up and another tenant's runs complete, before and after."""
    queue = f"iso-{unique}"
    names = _names_of_the_broker(queue)
    with (
        broker_for(broker, own_store, queue, *names) as (store_url, broker_url),
        running_workers(store_url, [queue], 2, broker_url=broker_url) as workers,
        running_api(store_url, {"TURNSTILE_BROKER_URL": broker_url or store_url}) as api,
    ):
        client = client_for(store_url, broker_url)
        _completes(client, f"v-{unique}", queue)
        attacker = f"a-{unique}"
        env = {"TURNSTILE_REDIS_URL": store_url, "TURNSTILE_BROKER_URL": broker_url or store_url}
        with http(api, make_key(store_url, attacker)) as web:
            for i, name in enumerate(names):
                run_id = f"run_{unique}_r{i}"
                with pytest.raises(SubmissionNameError, match="reserved by the broker"):
                    client.submit(attacker, USER, "support", GOAL, {}, queue=name, run_id=run_id)
                said = runner.invoke(app, ["submit", "--tenant", attacker, "--user", USER,
                                           "--job", "support", "--goal", GOAL, "--queue", name],
                                     env=env)  # fmt: skip
                assert said.exit_code == 1 and said.stderr.count("\n") == 1, said.output
                assert "reserved by the broker" in said.stderr
                reply = web.post(
                    "/v1/runs", json={"user": USER, "goal": GOAL, "job": "support", "queue": name}
                )
                assert (
                    "reserved by the broker"
                    in _one_line_problem(reply, 422, "invalid_submission")["detail"]
                )
                _nothing_written(client, attacker, name, run_id)

        # Steps already waiting on those queues (sent by a client without the rule): the
        # dispatcher publishes them under the namespace, where no worker reads.
        send = route(client.client, client.config, sender(client.config))
        for i, name in enumerate(names):
            send(StepMessage(attacker, f"run_{unique}_{i}", 1, name), 30.0, 40.0)
        if broker_url is None:
            broker_client = client.client
            wait_until(lambda: all(broker_client.llen(layout.broker_queue(n)) == 1 for n in names),
                       what="each step published under the namespace")  # fmt: skip
            assert broker_client.type("unacked") in ("none", "hash")
            for name in names:
                assert broker_client.type(name) != "list", name
        else:
            wait_until(lambda: all(layout.broker_depth(broker_url, n) == 1 for n in names),
                       what="each step published to its queue under the namespace")  # fmt: skip
            with Connection(broker_url) as conn, pytest.raises(Exception, match="NOT_FOUND"):
                channel: Any = conn.channel()
                channel.queue_declare(queue, passive=True)  # none by the bare name
        for i in range(3):  # each delivery acks through kombu's unacked hash: it still works
            _completes(client, f"v{i}-{unique}", queue)
        _alive(workers)
        client.client.sadd(keys.QUEUES, *names)  # as a store from before the rule holds them
        viewed = runner.invoke(app, ["queues", "--json"], env=env)
        assert viewed.exit_code == 0, viewed.output
        assert set(names) <= {v["name"] for v in json.loads(viewed.stdout)}


@pytest.mark.slow  # over 10 s on 2 cores: CI runs it in the slow part
@pytest.mark.parametrize("where", ["broker list", "pending set"])
def test_a_queue_broken_by_hand_is_skipped_shown_and_mended(
    where: str, own_store: str, unique: str
) -> None:
    """A key of another type where a queue's broker list (or a tenant's pending set on it)
    should be: every other queue's dispatch goes on, no worker exits, the queue is said
    broken once per worker and shown broken by `turnstile queues`, `GET /v1/queues` and the
    console (never a 500; its backlog is a 503 problem); once the key is mended its runs go."""
    broken, healthy = f"a-{unique}", f"b-{unique}"
    store = redis.Redis.from_url(own_store, decode_responses=True)
    bad_key = (layout.broker_queue(broken) if where == "broker list"
               else keys.pending(f"x-{unique}", broken, "start"))  # fmt: skip
    with running_workers(own_store, [broken, healthy], 2) as workers, running_api(own_store) as api:
        client = client_for(own_store)
        store.set(bad_key, "not a list")
        if where == "pending set":  # as a push leaves it: the tenant active on the queue
            store.sadd(keys.fair_active(broken), f"x-{unique}")
            store.sadd(keys.FAIR_QUEUES, broken)
        stuck = client.submit(f"z-{unique}", USER, "support", GOAL, {}, queue=broken)
        for i in range(3):
            _completes(client, f"y{i}-{unique}", healthy)
        assert not settled(client, [stuck])
        wait_until(lambda: any(w.events("queue_broken") for w in workers), what="said broken")
        _alive(workers)

        viewed = runner.invoke(app, ["queues", "--json"], env={"TURNSTILE_REDIS_URL": own_store})
        assert viewed.exit_code == 0, viewed.output
        views = json.loads(viewed.stdout)
        shown = {v["name"]: v["broken"] for v in views}
        assert "WRONGTYPE" in shown[broken] and shown[healthy] == ""
        with http(api, make_key(own_store, "ops", Role.OPERATOR)) as web:
            listed = web.get("/v1/queues")
            assert listed.status_code == 200, listed.text
            by_name = {q["name"]: q for q in listed.json()["queues"]}
            assert "WRONGTYPE" in by_name[broken]["broken"] and by_name[healthy]["broken"] == ""
            assert (
                "WRONGTYPE"
                in _one_line_problem(web.get(f"/v1/queues/{broken}/backlog"), 503, "queue_broken")[
                    "detail"
                ]
            )
            page = _console_page(api, make_key(own_store, "ops2", Role.OPERATOR), "/queues")
            assert page.status_code == 200 and "broken: " in page.text

        store.delete(bad_key)  # mended: the dispatcher and the workers take it back
        wait_until(lambda: settled(client, [stuck]), timeout_s=90, what="the stuck run ends")
        assert client.state(stuck).outcome == "completed"
        _alive(workers)
        wait_until(lambda: any(w.events("queue_mended") for w in workers), what="said mended")
    for worker in workers:  # once per worker and part, not once per pass
        said = [e for e in worker.events("queue_broken") if e["queue"] == broken]
        assert len([e for e in said if e["by"] == "consumer"]) <= 1, said
        assert len([e for e in said if e["by"] == "dispatcher"]) <= 1, said
    if where == "broker list":  # each worker read the broken list and left it out
        assert all(any(e["by"] == "consumer" for e in w.events("queue_broken")) for w in workers)
    assert store.hgetall(keys.BROKEN_QUEUES) == {}
    store.close()


def _console_page(api: ApiServer, key: str, path: str) -> httpx.Response:
    """A console page, logged in with `key` through the login form."""
    with httpx.Client(base_url=f"{api.url}/console", timeout=30) as browser:
        form = browser.get("/login")
        token = re.search(r'name="csrf" value="([^"]+)"', form.text)
        assert token is not None, form.text
        logged = browser.post("/login", data={"key": key, "csrf": token.group(1), "next": ""})
        assert logged.status_code in (302, 303), logged.text
        return browser.get(path)


def test_who_may_submit_to_which_queue_is_the_operators_to_say(redis_url: str, unique: str) -> None:
    """By default a client may submit to the queues the workers serve (registered by each
    worker before it says it is ready) and to the default queue; an operator may give a
    tenant a list of its own (`turnstile tenants set T queues=...`) or the deployment one
    (TURNSTILE_SUBMIT_QUEUES). Any other queue is refused in one line by the client, the CLI
    (exit 1) and the HTTP API (403), and nothing is written."""
    served, idle, main = f"s-{unique}", f"i-{unique}", f"d-{unique}"
    tenant, other = f"t-{unique}", f"u-{unique}"
    client = client_for(redis_url, submit_queues="", default_queue=main)
    env = {"TURNSTILE_REDIS_URL": redis_url, "TURNSTILE_SUBMIT_QUEUES": ""}

    def refused_everywhere(who: str, queue: str, said: str, web: httpx.Client) -> None:
        run_id = f"run_{who}_{queue}"
        with pytest.raises(QueueNotAllowedError, match=re.escape(said)):
            client.submit(who, USER, "support", GOAL, {}, queue=queue, run_id=run_id)
        cli = runner.invoke(app, ["submit", "--tenant", who, "--user", USER, "--job", "support",
                                  "--goal", GOAL, "--queue", queue], env=env)  # fmt: skip
        assert cli.exit_code == 1 and cli.stderr == f"error: {said}\n", cli.output
        problem = _one_line_problem(
            web.post(
                "/v1/runs", json={"user": USER, "goal": GOAL, "job": "support", "queue": queue}
            ),
            403,
            "queue_not_allowed",
        )  # fmt: skip
        assert problem["detail"] == said and problem["title"] == "Forbidden"
        assert client.client.hget(RUN_TENANTS, run_id) is None

    with (
        running_api(redis_url, {"TURNSTILE_SUBMIT_QUEUES": ""}) as api,
        http(api, make_key(redis_url, tenant)) as web,
    ):
        said = f"no worker serves queue {idle!r}: start one with `turnstile worker --queues "
        refused_everywhere(tenant, idle, said + f"{idle}`, or list the queue in "
                           "TURNSTILE_SUBMIT_QUEUES", web)  # fmt: skip
        _nothing_written(client, tenant, idle)
        assert client.submit(tenant, USER, "support", GOAL, {}, queue=main)  # the default queue

        with running_workers(redis_url, [served], 1) as workers:
            assert client.client.hexists(keys.SERVED_QUEUES, served)  # before its ready line
            _completes(client, tenant, served)
            made = web.post(
                "/v1/runs", json={"user": USER, "goal": GOAL, "job": "support", "queue": served}
            )
            assert made.status_code == 202, made.text

            own = runner.invoke(app, ["tenants", "set", tenant, f"queues={idle}"], env=env)
            assert own.exit_code == 0 and f"queues={idle}" in own.stdout, own.output
            refused_everywhere(tenant, served, f"queue {served!r} is not open to tenant "
                               f"{tenant!r}", web)  # fmt: skip
            assert client.submit(tenant, USER, "support", GOAL, {}, queue=idle)  # its own list
            _completes(client, other, served)  # another tenant: the served queues still
            bad = runner.invoke(app, ["tenants", "set", tenant, "queues=unacked"], env=env)
            assert bad.exit_code == 1 and "reserved by the broker" in bad.stderr, bad.output
            shown = json.loads(runner.invoke(app, ["tenants", "show", tenant, "--json"],
                                             env=env).stdout)  # fmt: skip
            assert shown[0]["queues"] == [idle]
            cleared = runner.invoke(app, ["tenants", "set", tenant, "queues=none"], env=env)
            assert cleared.exit_code == 0, cleared.output
            _completes(client, tenant, served)
            _alive(workers)

    listed = client_for(redis_url, submit_queues=idle)  # the deployment's own list
    with pytest.raises(QueueNotAllowedError, match="TURNSTILE_SUBMIT_QUEUES lists"):
        listed.submit(other, USER, "support", GOAL, {}, queue=served)
    assert listed.submit(other, USER, "support", GOAL, {}, queue=idle)
