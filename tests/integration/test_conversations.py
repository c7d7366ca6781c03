"""Conversations and double texting, through real Celery worker processes on a real server.

Four conversations of one tenant, one per policy (reject, enqueue, interrupt, merge), each
with a slow first run: a second message comes while that run's turn is in flight, submitted
twice (the same idempotency key), every step message is delivered twice (the workers' chaos
drill), and every worker is SIGKILLed mid-turn and replaced. A sampler reads the store in one
transaction every 20 ms the whole time: no conversation ever has two active runs
(running, suspended or parked), and the one it has is the one the conversation names. A
merged follow-up is seen by the next turn's view exactly once, and reaches the model's input
as the wire-format server received it. Bad input is a one-line refusal with nothing written.
"""

from __future__ import annotations

import functools
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
import redis
from typer.testing import CliRunner

from tests.integration.apiserver import ApiServer, http, make_key, running_api
from tests.integration.workers import (
    WorkerProcess,
    client_for,
    ledger_is_the_runs_usage,
    running_workers,
    settled,
    stop_all,
    wait_until,
)
from tests.wire.wire import MODELS, wire_server
from turnstile.errors import ConversationBusyError, SubmissionError, SubmissionNameError
from turnstile.jobs.outcomes import Outcome
from turnstile.jobs.support.scenarios import BY_LETTER, GOAL, USER
from turnstile.worker.cli.main import app
from turnstile.worker.client._client import Client
from turnstile.worker.store import keys

pytestmark = pytest.mark.integration

runner = CliRunner()
LIVE = ("running", "suspended", "parked")  # what counts as active
SLOW = {"sleep_s": {"get_order": 2.5, "issue_refund": 2.5, "send_status_email": 2.5}}
DUPLICATING = {"TURNSTILE_CHAOS_SEND_COPIES": "2"}
FOLLOW_UP = "also, the box was wet"


@dataclass
class Sampler:
    """Reads every run of the tenant and every conversation's `active` in one MULTI/EXEC, over
    and over, from a thread of its own; says what broke the one-active rule, if anything."""

    store: redis.Redis
    tenant: str
    conversations: list[str]
    samples: int = 0
    broken: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def once(self) -> None:
        ids = [str(r) for r in self.store.zrange(keys.runs(self.tenant), 0, -1)]
        pipe = self.store.pipeline(transaction=True)
        for run_id in ids:
            pipe.hmget(keys.run(self.tenant, run_id), "status", "conversation")
        for key in self.conversations:
            pipe.hget(keys.conversation(self.tenant, key), "active")
        replies = pipe.execute()
        runs, named = replies[: len(ids)], replies[len(ids) :]
        for key, active in zip(self.conversations, named, strict=True):
            live = [r for r, (status, conv) in zip(ids, runs, strict=True)
                    if conv == key and status in LIVE]  # fmt: skip
            if len(live) > 1 or (live and live != [active]):
                self.broken.append(f"{key}: live {live}, the conversation names {active}")
        self.samples += 1

    def loop(self) -> None:
        while not self.stop.wait(0.02):
            self.once()


def ready_or_gone(worker: WorkerProcess) -> bool:
    assert worker.process is not None
    return '"worker_ready"' in worker.log() or worker.process.poll() is not None


@contextmanager
def workers_up(redis_url: str, queue: str, prefix: str) -> Iterator[list[WorkerProcess]]:
    """Two duplicating worker processes of two pool processes each, given the time a loaded
    machine needs to start them."""
    workers = [
        WorkerProcess(redis_url, [queue], name=f"{prefix}{i}-{time.monotonic_ns()}",
                      env=DUPLICATING, concurrency=2).start()
        for i in range(2)
    ]  # fmt: skip
    try:
        for worker in workers:
            wait_until(functools.partial(ready_or_gone, worker), timeout_s=180,
                       what=f"worker {worker.name} to be ready")  # fmt: skip
            assert '"worker_ready"' in worker.log(), worker.log()[-2000:]
        yield workers
    finally:
        stop_all(workers, 10.0)


@contextmanager
def sampling(redis_url: str, tenant: str, conversations: list[str]) -> Iterator[Sampler]:
    store = redis.Redis.from_url(redis_url, decode_responses=True)
    sampler = Sampler(store, tenant, conversations)
    thread = threading.Thread(target=sampler.loop, daemon=True)
    thread.start()
    try:
        yield sampler
    finally:
        sampler.stop.set()
        thread.join(10)
        store.close()


def events(client: Client, tenant: str, run_id: str) -> list[tuple[str, dict[str, Any]]]:
    return client.store.events(tenant, run_id)


def stream_ms(event_id: str) -> int:
    """When the server appended the entry (ms): comparable across streams, as their sequence
    numbers are not."""
    return int(event_id.partition("-")[0])


def running(client: Client, tenant: str) -> list[str]:
    return [str(r) for r in client.client.smembers(keys.by_status(tenant, "running"))]


def in_flight(client: Client, tenant: str, run_ids: list[str]) -> bool:
    running = client.client.hkeys(keys.inflight(tenant))
    return all(r in {str(x) for x in running} for r in run_ids)


@pytest.mark.slow  # kills and restarts its workers: a minute and a half on a loaded machine
def test_each_policy_keeps_one_active_run_through_duplicates_and_kills(
    redis_url: str, unique: str
) -> None:
    """reject, enqueue, interrupt and merge, each in a conversation whose first run is
    mid-turn when the second message comes (twice) and when every worker is SIGKILLed; steps
    are delivered twice throughout. One active run per conversation at every sample; then
    each policy's result, and the tenant's ledger exactly what its runs used."""
    tenant, queue = f"t-{unique}", f"conv-{unique}"
    policies = ["reject", "enqueue", "interrupt", "merge"]
    convs = {p: f"c-{p}" for p in policies}
    client = client_for(redis_url)
    first: dict[str, str] = {}
    second: dict[str, str] = {}
    with (
        sampling(redis_url, tenant, list(convs.values())) as sampler,
        workers_up(redis_url, queue, "before") as workers,
    ):
        for policy, key in convs.items():
            first[policy] = client.submit(tenant, USER, "support", GOAL, SLOW, queue=queue,
                                          conversation=key)  # fmt: skip
        wait_until(lambda: in_flight(client, tenant, list(first.values())), timeout_s=90,
                   what="every first run to be mid-turn")  # fmt: skip
        for policy, key in convs.items():
            goal = FOLLOW_UP if policy == "merge" else f"{GOAL} ({policy})"
            for _ in range(2):  # a duplicate submission: the same key, the same answer
                try:
                    made = client.submit_run(
                        tenant, USER, "support", goal, SLOW if policy != "merge" else None,
                        queue=queue, conversation=key, conversation_policy=policy,
                        idempotency_key=f"second-{policy}",
                    )  # fmt: skip
                except ConversationBusyError as exc:
                    assert policy == "reject" and exc.active_run == first[policy], exc
                    assert first[policy] in str(exc)
                    continue
                assert policy != "reject"
                second[policy] = made.run_id
        # Every run that may run is mid-turn (a first run, or an interrupting run that
        # started at once because its first run was between turns): kill them there.
        wait_until(lambda: in_flight(client, tenant, running(client, tenant)), timeout_s=90,
                   what="every running run to be mid-turn")  # fmt: skip
        for worker in workers:
            worker.kill()
        assert sampler.samples > 0
        with workers_up(redis_url, queue, "after") as replacements:
            everyone = [*first.values(), *second.values()]
            wait_until(lambda: settled(client, everyone), timeout_s=180,
                       what=lambda: str({r: client.run_hash(r)[1]["status"]
                                         for r in everyone}))  # fmt: skip
            # reject: the conversation is free once its run ended; a reject then starts
            late = client.submit_run(tenant, USER, "support", GOAL, None, queue=queue,
                                     conversation=convs["reject"],
                                     conversation_policy="reject")  # fmt: skip
            assert late.conversation_action == "started"
            wait_until(lambda: settled(client, [late.run_id]), timeout_s=60, what="the late run")
            stop_all(replacements)
    assert sampler.broken == [], sampler.broken[:5]
    assert sampler.samples > 100, sampler.samples

    states = {r: client.state(r) for r in [*first.values(), *second.values(), late.run_id]}
    outcome = {r: s.outcome for r, s in states.items()}
    # reject: no second run; the first completed, and so did the late one
    assert "reject" not in second
    assert outcome[first["reject"]] is Outcome.COMPLETED
    assert outcome[late.run_id] is Outcome.COMPLETED
    # enqueue: the second waited, then started only once the first had finished
    a, b = first["enqueue"], second["enqueue"]
    assert outcome[a] is Outcome.COMPLETED and outcome[b] is Outcome.COMPLETED
    finished = next(eid for eid, e in events(client, tenant, a) if e["type"] == "finished")
    started = [eid for eid, e in events(client, tenant, b) if e["type"] == "started"]
    turns = [eid for eid, e in events(client, tenant, b) if e["type"] == "turn"]
    assert len(started) == 1 and turns
    assert stream_ms(finished) <= stream_ms(started[0]) <= stream_ms(turns[0])
    # interrupt: the first ended superseded at a turn boundary, the second ran to the end
    a, b = first["interrupt"], second["interrupt"]
    assert outcome[a] is Outcome.SUPERSEDED, states[a].reason
    assert b in (states[a].reason or "")
    assert outcome[b] is Outcome.COMPLETED
    # merge: no second run; the first took the follow-up in exactly once, in one turn
    a = first["merge"]
    assert second["merge"] == a
    assert [f.text for f in states[a].followups] == [FOLLOW_UP]
    seen = [e.get("followups_seen") for _, e in events(client, tenant, a) if e["type"] == "turn"]
    assert seen.count(1) == 1 and sum(s or 0 for s in seen) == 1, seen
    assert outcome[a] is Outcome.COMPLETED
    assert not any(e["type"] == "followups_unseen" for _, e in events(client, tenant, a))
    # every hold settled or released, and charged exactly what the runs used
    ledger_is_the_runs_usage(client, tenant, list(states))
    for key in convs.values():
        assert client.client.hget(keys.conversation(tenant, key), "active") is None
        assert client.client.llen(keys.conversation_waiting(tenant, key)) == 0


@pytest.mark.slow  # over 10 s on 2 cores: CI runs it in the slow part
def test_a_merged_follow_up_reaches_the_models_input(redis_url: str, unique: str) -> None:
    """A support run on the OpenAI wire format: a follow-up merged while its first turn is at
    the provider is in the next request's user message (the run's view), as the server
    received it, and in every request after; never in the ones before."""
    tenant, queue = f"t-{unique}", f"q-{unique}"
    client = client_for(redis_url)
    budget = {"max_tokens": 40_000, "max_tool_calls": 8}
    with (
        wire_server("openai", "support_run", delay_s=1.0) as wire,
        running_workers(redis_url, [queue], 1, env=wire.env),
    ):
        run_id = client.submit(tenant, USER, "support", GOAL, {"model": MODELS["openai"]},
                               budget=budget, queue=queue, conversation="chat-1")  # fmt: skip
        wait_until(lambda: len(wire.received()) >= 1, timeout_s=60, what="the first request")
        merged = client.submit_run(tenant, USER, "support", FOLLOW_UP, queue=queue,
                                   conversation="chat-1")  # fmt: skip
        assert (merged.run_id, merged.conversation_action) == (run_id, "merged")
        wait_until(lambda: settled(client, [run_id]), timeout_s=90, what="the run to end")
        asked = wire.received()
    views = [json.loads(r["body"]["messages"][1]["content"]) for r in asked]
    has = [FOLLOW_UP in (v.get("followups") or []) for v in views]
    assert len(asked) == 5, has
    assert has == [False, True, True, True, True], has
    state = client.state(run_id)
    assert state.outcome is Outcome.COMPLETED, state.reason
    assert [f.text for f in state.followups] == [FOLLOW_UP]
    # `turnstile watch` says the follow-up in words (it printed the raw JSON event before).
    watched = runner.invoke(app, ["watch", run_id], env={"TURNSTILE_REDIS_URL": redis_url})
    assert watched.exit_code == 0, watched.output
    lines = watched.stdout.splitlines()
    said = f"follow-up merged into the run (the model sees it from its next turn): {FOLLOW_UP!r}"
    assert said in lines, lines
    assert not any(line.startswith("{") for line in lines), lines


def test_interrupting_a_suspended_run_ends_it_at_once_and_releases_its_holds(
    redis_url: str, unique: str
) -> None:
    """A run waiting for a person's approval is active; an interrupt ends it `superseded` at
    once (nothing is in flight) and starts the new run, which completes; nothing stays held."""
    tenant, queue = f"t-{unique}", f"q-{unique}"
    client = client_for(redis_url)
    held_params = BY_LETTER["G"].params  # a refund above the shop's automatic limit
    with running_workers(redis_url, [queue], 1):
        held = client.submit(tenant, USER, "support", GOAL, held_params, queue=queue,
                             conversation="c")  # fmt: skip
        wait_until(lambda: client.run_hash(held)[1]["status"] == "suspended", timeout_s=60,
                   what="the run to wait for approval")  # fmt: skip
        with pytest.raises(ConversationBusyError):
            client.submit(tenant, USER, "support", GOAL, queue=queue, conversation="c",
                          conversation_policy="reject")  # fmt: skip
        made = client.submit_run(tenant, USER, "support", GOAL, queue=queue, conversation="c",
                                 conversation_policy="interrupt")  # fmt: skip
        assert made.conversation_action == "interrupting" and made.sent
        assert client.state(held).outcome is Outcome.SUPERSEDED
        wait_until(lambda: settled(client, [made.run_id]), timeout_s=60, what="the new run")
    assert client.state(made.run_id).outcome is Outcome.COMPLETED
    ledger_is_the_runs_usage(client, tenant, [held, made.run_id])


def test_cancelling_releases_the_conversation_and_a_waiting_run(
    redis_url: str, unique: str
) -> None:
    """Cancelling the active run starts the first waiting one; cancelling a waiting run takes
    it off the list; the conversation is free once none is left."""
    tenant, queue = f"t-{unique}", f"idle-{unique}"  # no worker reads it: the runs stay put
    client = client_for(redis_url)
    first = client.submit(tenant, USER, "support", GOAL, queue=queue, conversation="c")
    waiting = [
        client.submit(tenant, USER, "support", f"{GOAL} {n}", queue=queue, conversation="c",
                      conversation_policy="enqueue")
        for n in range(2)
    ]  # fmt: skip
    assert [client.run_hash(r)[1]["status"] for r in waiting] == ["waiting", "waiting"]
    client.cancel(waiting[1], by="ann")
    assert client.state(waiting[1]).outcome is Outcome.CANCELLED
    client.cancel(first, by="ann")
    conv = keys.conversation(tenant, "c")
    assert client.client.hget(conv, "active") == waiting[0]
    assert client.run_hash(waiting[0])[1]["status"] == "running"
    assert client.client.llen(keys.conversation_waiting(tenant, "c")) == 0
    client.cancel(waiting[0], by="ann")
    assert client.client.hget(conv, "active") is None
    again = client.submit_run(tenant, USER, "support", GOAL, queue=queue, conversation="c",
                              conversation_policy="reject")  # fmt: skip
    assert again.conversation_action == "started"


def test_a_retried_interrupt_finishes_what_a_crashed_first_attempt_left(
    redis_url: str, unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The interrupting run is stored and the active run marked in one script; a client that
    died right after it left the active run to its next turn boundary, which a run that no
    step will come to (here: one no worker reads) never reaches. The retry of the same
    submission ends it `superseded` and starts the new run."""
    tenant, queue = f"t-{unique}", f"idle-{unique}"
    client = client_for(redis_url)
    active = client.submit(tenant, USER, "support", GOAL, queue=queue, conversation="c")
    interrupt: dict[str, Any] = {
        "tenant": tenant, "user": USER, "job": "support", "goal": GOAL, "queue": queue,
        "conversation": "c", "conversation_policy": "interrupt", "idempotency_key": "again",
    }  # fmt: skip
    with monkeypatch.context() as crash:
        crash.setattr(client, "_supersede_now", lambda *_: False)  # died before it
        made = client.submit_run(**interrupt)
    assert client.run_hash(active)[1]["status"] == "running"
    assert client.run_hash(made.run_id)[1]["status"] == "waiting"
    retried = client.submit_run(**interrupt)
    assert (retried.run_id, retried.created) == (made.run_id, False)
    assert client.state(active).outcome is Outcome.SUPERSEDED
    assert client.run_hash(made.run_id)[1]["status"] == "running"
    assert client.client.hget(keys.conversation(tenant, "c"), "active") == made.run_id


# -- bad input ------------------------------------------------------------------------------

TOO_LONG = "k" * 129


def _nothing_written(store: redis.Redis, tenant: str, run_id: str | None = None) -> None:
    assert store.zcard(keys.runs(tenant)) == 0
    assert not store.sismember(keys.TENANTS, tenant)
    assert not list(store.scan_iter(match=f"turnstile:{{{tenant}}}:conv*"))
    if run_id is not None:
        assert store.hget(keys.RUN_TENANTS, run_id) is None


@pytest.mark.parametrize(
    ("conversation", "policy", "error", "said"),
    [
        ("c", "bogus", SubmissionError, "unknown conversation policy 'bogus'"),
        ("c", "Merge", SubmissionError, "unknown conversation policy 'Merge'"),
        (TOO_LONG, "merge", SubmissionNameError, "bad conversation"),
        ("two words", None, SubmissionNameError, "bad conversation"),
        ("-x", None, SubmissionNameError, "may not start with '-'"),
        ("", None, SubmissionNameError, "conversation must be a non-empty name"),
        (None, "merge", SubmissionError, "a conversation policy needs a conversation key"),
    ],
)
def test_bad_conversation_input_is_refused_by_the_client_with_nothing_written(
    *, redis_url: str, unique: str, conversation: str | None, policy: str | None,
    error: type[Exception], said: str,
) -> None:  # fmt: skip
    tenant, run_id = f"t-{unique}", f"run-{unique}"
    client = client_for(redis_url)
    with pytest.raises(error, match=said) as raised:
        client.submit(tenant, USER, "support", GOAL, queue=f"q-{unique}", run_id=run_id,
                      conversation=conversation, conversation_policy=policy)  # fmt: skip
    assert "\n" not in str(raised.value)
    _nothing_written(client.client, tenant, run_id)
    client.close()


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--conversation", "c", "--policy", "bogus"], "unknown conversation policy 'bogus'"),
        (["--conversation", TOO_LONG], "bad conversation"),
        (["--policy", "merge"], "a conversation policy needs a conversation key"),
    ],
)
def test_bad_conversation_input_is_one_line_from_the_cli(
    redis_url: str, unique: str, args: list[str], said: str
) -> None:
    tenant = f"t-{unique}"
    result = runner.invoke(
        app,
        ["submit", "--job", "support", "--tenant", tenant, "--user", USER, "--goal", GOAL,
         "--queue", f"q-{unique}", *args],
        env={"TURNSTILE_REDIS_URL": redis_url},
    )  # fmt: skip
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code != 0 and len(lines) == 1, result.output
    assert lines[0].startswith("error:") and said in lines[0], lines
    store = redis.Redis.from_url(redis_url, decode_responses=True)
    _nothing_written(store, tenant)
    store.close()


@pytest.fixture(scope="module")
def api(redis_url: str) -> Iterator[ApiServer]:
    with running_api(redis_url) as server:
        yield server


def _problem(reply: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert reply.status_code == status, reply.text
    assert reply.headers["content-type"] == "application/problem+json"
    body: dict[str, Any] = reply.json()
    assert body["code"] == code and "\n" not in body["detail"], body
    return body


def test_over_http_a_busy_conversation_is_a_409_naming_its_run_and_bad_input_a_422(
    redis_url: str, api: ApiServer, unique: str
) -> None:
    tenant, queue = f"t-{unique}", f"idle-{unique}"
    store = redis.Redis.from_url(redis_url, decode_responses=True)
    body = {"user": USER, "goal": GOAL, "job": "support", "queue": queue}
    with http(api, make_key(redis_url, tenant)) as web:
        for bad in ({"conversation": "c", "conversation_policy": "bogus"},
                    {"conversation": TOO_LONG}, {"conversation": "a b"}):  # fmt: skip
            _problem(web.post("/v1/runs", json={**body, **bad}), 422, "invalid_request")
        _problem(web.post("/v1/runs", json={**body, "conversation_policy": "merge"}), 422,
                 "invalid_submission")  # fmt: skip
        _nothing_written(store, tenant)
        made = web.post("/v1/runs", json={**body, "conversation": "c"})
        assert made.status_code == 202, made.text
        active = made.json()["run_id"]
        assert made.json()["conversation_action"] == "started"
        busy = _problem(
            web.post("/v1/runs", json={**body, "conversation": "c",
                                       "conversation_policy": "reject"}),
            409, "conversation_busy",
        )  # fmt: skip
        assert active in busy["detail"]
        merged = web.post("/v1/runs", json={**body, "goal": FOLLOW_UP, "conversation": "c"})
        assert merged.status_code == 202, merged.text
        assert merged.json()["run_id"] == active
        assert merged.json()["conversation_action"] == "merged"
        queued = web.post("/v1/runs", json={**body, "conversation": "c",
                                            "conversation_policy": "enqueue"})  # fmt: skip
        assert queued.json()["status"] == "waiting" and queued.json()["active_run"] == active
    assert store.zcard(keys.runs(tenant)) == 2
    store.close()
