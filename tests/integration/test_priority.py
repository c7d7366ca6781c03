"""Priorities within a tenant's fair share, on a real Valkey: the order the pending sets give
(a higher priority first, a continuation before a first step of its level, a waiting step's
priority rising with its wait), the eager claim yielding to a step that outranks it (waiting,
or sent and not loaded), and every
bad priority refused in one line with nothing written, from the client, the CLI and HTTP."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest
import redis
from typer.testing import CliRunner

from tests.integration.apiserver import ApiServer, http, make_key, running_api
from tests.integration.workers import client_for, running_workers, settled, wait_until
from turnstile.jobs.support.scenarios import GOAL, USER
from turnstile.worker.broker import layout
from turnstile.worker.broker.message import StepMessage
from turnstile.worker.cli.main import app
from turnstile.worker.client._client import Client
from turnstile.worker.scheduling import fair
from turnstile.worker.scheduling.dispatcher import Dispatcher
from turnstile.worker.scheduling.priority import PriorityError
from turnstile.worker.settings import Settings
from turnstile.worker.store import keys
from turnstile.worker.store.runs import Change
from turnstile.worker.store.values import server_ms

pytestmark = pytest.mark.integration

runner = CliRunner()
AGING_S = 1.0  # the takers' aging here: a step gains a level per second it waited


def _taker(client: Client, aging_s: float = AGING_S) -> Dispatcher:
    """A dispatcher that publishes nothing: its takes say the order fair share gives."""
    config = Settings(redis_url="redis://unused", priority_aging_s=aging_s)
    return Dispatcher(client.client, None, config, lambda batch: None)


def _taken(taker: Dispatcher, tenant: str, queue: str) -> list[tuple[str, int]]:
    """Every pending step of the tenant on the queue, as fair share takes them: (run, version)."""
    out = []
    while (entry := taker._take(tenant, queue)) is not None:
        out.append((str(entry["run_id"]), int(entry["version"])))
    return out


def _submit(client: Client, tenant: str, queue: str, priority: int) -> str:
    run_id = client.submit(tenant, USER, "support", GOAL, {}, queue=queue, priority=priority)
    time.sleep(0.002)  # queueing times are kept to the millisecond: make each its own
    return run_id


def _continue(client: Client, tenant: str, run_id: str, queue: str) -> None:
    """Queue the run's second step, as a sender other than a commit does (fair_push.lua)."""
    send = fair.route(client.client, client.config, lambda msg, soft, hard: None)
    send(StepMessage(tenant, run_id, 2, queue), 10.0, 12.0)
    time.sleep(0.002)


def _age(client: Client, tenant: str, queue: str, run_id: str, waited_s: float) -> None:
    """Make the run's pending step look queued `waited_s` earlier than it was."""
    for kind in ("cont", "start"):
        key = keys.pending(tenant, queue, kind)
        for entry in map(str, client.client.zrange(key, 0, -1)):
            if json.loads(entry)["run_id"] == run_id:
                client.client.zincrby(key, -int(waited_s * 1000), entry)
                return
    raise AssertionError(f"no pending step of {run_id}")


def test_higher_priorities_are_taken_first_each_level_oldest_first(
    redis_url: str, unique: str
) -> None:
    """Runs submitted with priorities 2, 9, 5, 9, 0, 5 (default) are taken 9, 9, 5, 5, 2, 0,
    each level in the order it was queued."""
    client = client_for(redis_url)
    tenant, queue = f"t-{unique}", f"nobody-{unique}"
    ids = {}
    for name, priority in (("a2", 2), ("b9", 9), ("c5", 5), ("d9", 9), ("e0", 0)):
        ids[name] = _submit(client, tenant, queue, priority)
    ids["f5"] = client.submit(tenant, USER, "support", GOAL, {}, queue=queue)  # the default
    order = [run_id for run_id, _ in _taken(_taker(client), tenant, queue)]
    assert order == [ids[n] for n in ("b9", "d9", "c5", "f5", "a2", "e0")]


def test_a_continuation_goes_before_first_steps_of_its_priority_only(
    redis_url: str, unique: str
) -> None:
    """A continuation of priority 5 goes before an older first step of priority 5, but after
    a newer first step of priority 9; a continuation of priority 2 after both."""
    client = client_for(redis_url)
    tenant, queue = f"t-{unique}", f"nobody-{unique}"
    taker = _taker(client)
    running_5, running_2 = _submit(client, tenant, queue, 5), _submit(client, tenant, queue, 2)
    assert _taken(taker, tenant, queue) == [(running_5, 1), (running_2, 1)]
    new_5 = _submit(client, tenant, queue, 5)
    _continue(client, tenant, running_2, queue)
    _continue(client, tenant, running_5, queue)
    new_9 = _submit(client, tenant, queue, 9)
    assert _taken(taker, tenant, queue) == [(new_9, 1), (running_5, 2), (new_5, 1),
                                            (running_2, 2)]  # fmt: skip


def test_a_waiting_step_gains_a_level_per_aging_period(redis_url: str, unique: str) -> None:
    """With an aging of 1 s: a first step of priority 0 that has waited 8.5 s (8.5 levels) is
    still behind a new one of 9; one that has waited 9.5 s is ahead of it, and ahead of a
    continuation of 9 as well (aging crosses kinds; a tie would go to the higher priority)."""
    client = client_for(redis_url)
    tenant, queue = f"t-{unique}", f"nobody-{unique}"
    taker = _taker(client)
    low = _submit(client, tenant, queue, 0)
    _age(client, tenant, queue, low, 8.5)
    high = _submit(client, tenant, queue, 9)
    assert _taken(taker, tenant, queue) == [(high, 1), (low, 1)]

    low = _submit(client, tenant, queue, 0)
    _age(client, tenant, queue, low, 9.5)
    high = _submit(client, tenant, queue, 9)
    _continue(client, tenant, high, queue)  # the run's next step, waiting as well
    assert _taken(taker, tenant, queue)[0] == (low, 1)


def test_the_cap_on_active_runs_lets_continuations_of_any_priority_go(
    redis_url: str, unique: str
) -> None:
    """At its cap on active runs, a tenant's continuation of priority 0 goes though a first
    step of priority 9 waits (which the cap holds back)."""
    client = client_for(redis_url)
    tenant, queue = f"t-{unique}", f"nobody-{unique}"
    taker = _taker(client)
    running = _submit(client, tenant, queue, 0)
    assert _taken(taker, tenant, queue) == [(running, 1)]
    fair.set_caps(client.client, tenant, {"active_runs": 1})
    _submit(client, tenant, queue, 9)
    _continue(client, tenant, running, queue)
    assert _taken(taker, tenant, queue) == [(running, 2)]
    assert fair.tenant_view(client.client, tenant, [queue]).waiting == 1


def _commit_claiming(client: Client, tenant: str, queue: str, priority: int) -> bool:
    """Submit a run, say its first step went, and commit its turn asking to claim the next
    step (eager continuation); whether the commit claimed it (else it queued it)."""
    run_id = client.submit(tenant, USER, "support", GOAL, {}, queue=queue, priority=priority)
    start = keys.pending(tenant, queue, "start")
    for entry in map(str, client.client.zrange(start, 0, -1)):
        if json.loads(entry)["run_id"] == run_id:
            client.client.zrem(start, entry)
    client.client.hdel(keys.pending_index(tenant), run_id)
    client.client.zadd(keys.slots(tenant), {f"{run_id}:1": 2**40})
    following = StepMessage(tenant, run_id, 2, queue)
    committed = client.store.commit(
        Change(
            tenant=tenant, run_id=run_id, version=1, old_status="running", status="running",
            lease_ms=60_000, next_step=fair.pending_entry(following, 10.0, 12.0),
            claim=fair.claim(following, 12.0, client.config, f"tok-{run_id}"),
        )
    )  # fmt: skip
    assert committed.kind == "ok"
    assert (committed.claimed is not None) != committed.queued
    return committed.claimed is not None


def test_a_claimed_step_is_loaded_by_its_commit_as_a_delivery_would_be(
    redis_url: str, unique: str
) -> None:
    """The commit that claims the next step leaves what a delivered step's load would: the new
    version running, the claimed delivery's in-flight entry and its in-flight lease (not the
    pickup lease a queued step gets), its attempt counted, the next slot taken and the
    previous one given back, the step's ledger hold taken and recorded on the run."""
    client = client_for(redis_url)
    tenant, queue = f"t-{unique}", f"nobody-{unique}"
    r = client.client
    before = server_ms(r)
    assert _commit_claiming(client, tenant, queue, 5)
    (run_id,) = [str(m) for m in r.zrange(keys.runs(tenant), 0, -1)]
    run = {str(k): str(v) for k, v in r.hgetall(keys.run(tenant, run_id)).items()}
    assert (run["version"], run["status"], run["attempt_version"], run["attempts"]) == (
        "2", "running", "2", "1")  # fmt: skip
    assert run["attempt_tokens"] == f"tok-{run_id}"
    where, token, lease = str(r.hget(keys.inflight(tenant), run_id)).rsplit("|", 2)
    assert token == f"tok-{run_id}" and where.startswith(f"{queue}|")
    in_flight_ms = client.config.inflight_lease_s * 1000
    assert before + in_flight_ms <= int(lease) <= server_ms(r) + in_flight_ms
    assert r.zscore(keys.leases(tenant), run_id) == int(lease)
    slots = [str(m) for m in r.zrange(keys.slots(tenant), 0, -1)]
    assert slots == [f"{run_id}:2"]
    hold_id = json.loads(run["hold"])["argv"][0]  # the next turn's hold, taken by the claim
    assert run["holds"] == hold_id
    assert str(r.hget(keys.ledger(tenant)[2], f"r:{hold_id}")).startswith("P|")


def test_an_eager_claim_yields_to_a_waiting_step_that_outranks_it(
    redis_url: str, unique: str
) -> None:
    """A commit of a priority 5 run claims its next step while the tenant's first steps of
    priorities 2 and 5 wait (a continuation goes before its level's first steps), not while
    one of 9 waits, nor once the one of 2 has waited past 3 levels (aging 1 s); and it does
    while one of 6 waits if a first step of 5 has waited 2 levels (the take's order)."""
    client = client_for(redis_url, priority_aging_s=AGING_S)
    tenant, queue = f"t-{unique}", f"nobody-{unique}"
    assert _commit_claiming(client, tenant, queue, 5)  # nothing else waits
    low = _submit(client, tenant, queue, 2)
    _submit(client, tenant, queue, 5)
    assert _commit_claiming(client, tenant, queue, 5)
    _age(client, tenant, queue, low, 3.5)  # 2 + 3.5 levels: above 5
    assert not _commit_claiming(client, tenant, queue, 5)
    _taken(_taker(client), tenant, queue)  # empty the tenant's pending sets
    _submit(client, tenant, queue, 9)
    assert not _commit_claiming(client, tenant, queue, 5)
    assert _commit_claiming(client, tenant, queue, 9)  # the same priority, a continuation
    # A level's first step that has waited lifts the level: its continuation, this one, goes
    # before a newer first step of priority 6 (2 + 5 levels against 6), as the dispatcher's take.
    _taken(_taker(client), tenant, queue)
    old_5 = _submit(client, tenant, queue, 5)
    _age(client, tenant, queue, old_5, 2.0)
    _submit(client, tenant, queue, 6)
    assert _commit_claiming(client, tenant, queue, 5)
    assert _taken(_taker(client), tenant, queue)[0] == (old_5, 1)


def test_an_eager_claim_goes_past_its_tenants_sent_continuations_of_no_higher_priority(
    redis_url: str, unique: str
) -> None:
    """A continuation the dispatcher sent to the broker and no worker has loaded yet holds its
    slot and waits only for a worker: a commit of the same tenant claims its run's next step
    past one of the same or a lower priority (the run goes on where it is), not past one of a
    higher priority, nor past another tenant's sent step of any priority; a sent step noted
    without a priority (a dispatcher of an earlier release) outranks every claim."""
    client = client_for(redis_url)
    tenant, other, queue = f"t-{unique}", f"o-{unique}", f"nobody-{unique}"
    taker = _taker(client)
    sent_run = _submit(client, tenant, queue, 5)
    _continue(client, tenant, sent_run, queue)
    assert taker._fill(queue, 10) == 2  # its first step and its continuation, both sent
    score = client.client.zscore(keys.fair_sent(queue), f"{tenant}|{sent_run}:2")
    assert score is not None and score % 1 == 6 / 16  # sent with its priority, 5
    assert _commit_claiming(client, tenant, queue, 5)  # the same priority: goes on
    assert _commit_claiming(client, tenant, queue, 9)  # a higher one: goes on
    assert not _commit_claiming(client, tenant, queue, 4)  # the sent one outranks it
    queued = _pending_run(client, tenant, queue)  # its next step, queued instead
    assert _taken(taker, tenant, queue) == [(queued, 2)]
    _submit(client, other, queue, 0)
    assert taker._fill(queue, 10) == 1  # another tenant's first step, sent
    assert not _commit_claiming(client, tenant, queue, 9)
    _taken(taker, tenant, queue)
    assert taker._fill(queue, 10) == 0  # the next pass: the other tenant has nothing waiting
    client.client.delete(keys.fair_sent(queue))  # its step was loaded
    assert _commit_claiming(client, tenant, queue, 9)
    client.client.zadd(keys.fair_sent(queue), {f"{tenant}|run-x:3": server_ms(client.client)})
    assert not _commit_claiming(client, tenant, queue, 9)


def _pending_run(client: Client, tenant: str, queue: str) -> str:
    """The run whose continuation waits in the tenant's pending set (there is one)."""
    (entry,) = client.client.zrange(keys.pending(tenant, queue, "cont"), 0, -1)
    return str(json.loads(str(entry))["run_id"])


# -- with real workers ------------------------------------------------------------------------

ZERO_LATENCY: dict[str, Any] = {
    "model_latency_s": 0,
    "tool_latency_s": {"get_order": 0, "search_policy": 0, "issue_refund": 0,
                       "send_status_email": 0},
}  # fmt: skip
ONE_TURN = "tests.plugins:one_turn"  # toy_one_turn: a run of one turn of `turn_s` seconds


def _at(event: dict[str, Any]) -> float:
    return datetime.fromisoformat(str(event["at"])).timestamp()


def _events(client: Client, tenant: str, run_id: str) -> list[dict[str, Any]]:
    return [e for _, e in client.store.events(tenant, run_id)]


def _forget_tenant(client: Client, tenant: str, queue: str) -> None:
    """The test is over: nothing of this tenant is swept or dispatched again."""
    client.client.srem(keys.TENANTS, tenant)
    client.client.srem(keys.fair_active(queue), tenant)
    client.client.delete(
        keys.leases(tenant), keys.pending(tenant, queue, "cont"),
        keys.pending(tenant, queue, "start"), keys.pending_index(tenant), keys.slots(tenant),
    )  # fmt: skip
    client.client.delete(*layout.priority_lists(queue))


def test_high_priority_runs_go_before_a_backlog_of_low_ones(redis_url: str, unique: str) -> None:
    """With a backlog of 500 runs of priority 0 (zero-latency support runs, several turns
    each), a tenant's 20 runs of priority 9 submitted after them all finish before 100 of the
    low ones have, on 2 workers of 2 processes (continuations, eager claims and all)."""
    queue, tenant = f"prio-{unique}", f"p-{unique}"
    client = client_for(redis_url)
    lows = [client.submit(tenant, USER, "support", GOAL, ZERO_LATENCY, queue=queue, priority=0)
            for _ in range(500)]  # fmt: skip
    highs = [client.submit(tenant, USER, "support", GOAL, ZERO_LATENCY, queue=queue, priority=9)
             for _ in range(20)]  # fmt: skip
    started = time.monotonic()
    with running_workers(redis_url, [queue], 2, concurrency=2, stop_timeout_s=20):
        wait_until(lambda: settled(client, highs), timeout_s=180, what="the high runs end")
        # Every high run has stopped: the rest of the tenant's stopped runs are low ones.
        lows_done = int(client.client.scard(keys.by_status(tenant, "stopped"))) - len(highs)
    took = time.monotonic() - started
    _forget_tenant(client, tenant, queue)
    print(f"\n20 high runs ended {took:.1f} s after the workers were started; "
          f"{lows_done} of the 500 low ones had by then")  # fmt: skip
    assert all(client.run_hash(r)[1]["outcome"] == "completed" for r in highs)
    assert lows_done < 100
    assert len(lows) == 500


@pytest.mark.slow  # over 14 s on 2 cores: CI runs it in the slow part
def test_aging_bounds_the_wait_of_low_runs_under_a_steady_high_stream(
    redis_url: str, unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A steady stream of priority 9 runs (one turn of 0.1 s each, kept BACKLOG deep in the
    tenant's pending set, on a tenant capped at 2 turns in flight: the stream is always ahead
    of the workers) and, meanwhile, runs of priority 0, with an aging of 1 s. Each low run
    waits (its submission to its turn's commit, as its events say) no more than the bound of
    docs/scheduling.md, (9 - 0) x 1 s + B / mu: B the tenant's steps ahead of it when it was
    submitted (pending, on the broker, in flight), mu the rate its steps were served at
    meanwhile (from the runs' events), with SLACK_S for the turn itself and the dispatcher's
    wake-ups. And they did wait: the stream held them back until their priority had risen."""
    monkeypatch.setenv("TURNSTILE_JOBS", ONE_TURN)
    queue, tenant = f"aging-{unique}", f"g-{unique}"
    aging_s, spread, backlog, slack_s = 1.0, 9, 8, 1.5
    client = client_for(redis_url)
    fair.set_caps(client.client, tenant, {"turns_in_flight": 2})
    params = {"turn_s": 0.1}
    highs: list[str] = []
    lows: list[tuple[str, int]] = []  # run id, steps ahead of it when it was submitted
    stop = threading.Event()

    def stream() -> None:
        own = client_for(redis_url)
        while not stop.is_set():
            if fair.tenant_view(own.client, tenant, [queue]).waiting < backlog:
                highs.append(own.submit(tenant, USER, "toy_one_turn", "hi", params, queue=queue,
                                        priority=9))  # fmt: skip
            else:
                stop.wait(0.005)

    def ahead() -> int:
        view = fair.tenant_view(client.client, tenant, [queue])
        depth = sum(int(client.client.llen(name)) for name in layout.priority_lists(queue))
        return view.waiting + view.in_flight + depth

    env = {"TURNSTILE_JOBS": ONE_TURN, "TURNSTILE_PRIORITY_AGING_S": str(aging_s)}
    with running_workers(redis_url, [queue], 1, concurrency=2, env=env, stop_timeout_s=20):
        streaming = threading.Thread(target=stream)
        streaming.start()
        try:
            wait_until(lambda: int(client.client.scard(keys.by_status(tenant, "stopped"))) >= 10,
                       timeout_s=60, what="the stream flows")  # fmt: skip
            for _ in range(4):
                before = ahead()
                lows.append((client.submit(tenant, USER, "toy_one_turn", "lo", params,
                                           queue=queue, priority=0), before))  # fmt: skip
                stop.wait(2.0)  # the scenario: a low run every 2 s while the stream flows
            low_ids = [r for r, _ in lows]
            wait_until(lambda: settled(client, low_ids), timeout_s=120, what="the low runs end")
        finally:
            stop.set()
            streaming.join()
    waits, served = [], []
    for run_id, _ in lows:
        events = _events(client, tenant, run_id)
        submitted = next(e for e in events if e["type"] == "submitted")
        turn = next(e for e in events if e["type"] == "turn")
        waits.append(_at(turn) - _at(submitted))
        served.append((_at(submitted), _at(turn)))
    window = (min(s for s, _ in served), max(t for _, t in served))
    # The tenant's steps served while the low runs waited: every run's turn in the window.
    turns = [
        _at(e)
        for run_id in highs + [r for r, _ in lows]
        for e in _events(client, tenant, run_id)
        if e["type"] == "turn"
    ]
    mu = sum(1 for t in turns if window[0] <= t <= window[1]) / (window[1] - window[0])
    _forget_tenant(client, tenant, queue)
    bounds = [spread * aging_s + b / mu for _, b in lows]
    print(f"\nlow runs waited {[round(w, 2) for w in waits]} s; bounds "
          f"{[round(b, 2) for b in bounds]} s (+{slack_s} s); steps ahead "
          f"{[b for _, b in lows]}; served {mu:.1f} steps/s; {len(highs)} high runs")  # fmt: skip
    assert all(client.run_hash(r)[1]["outcome"] == "completed" for r, _ in lows)
    for wait, bound in zip(waits, bounds, strict=True):
        assert wait <= bound + slack_s
        assert wait >= spread * aging_s / 3  # held back by the stream, let through by aging


# -- bad input ------------------------------------------------------------------------------

BAD = [10, -1, True, 5.0, "5", None, 2**70]


def _nothing_written(store: redis.Redis, tenant: str) -> None:
    assert store.zcard(keys.runs(tenant)) == 0
    assert not store.sismember(keys.TENANTS, tenant)
    assert not store.keys(f"turnstile:{{{tenant}}}:*")


@pytest.mark.parametrize("priority", BAD, ids=[repr(p) for p in BAD])
def test_the_client_refuses_a_priority_that_is_not_0_to_9(
    redis_url: str, unique: str, priority: Any
) -> None:
    client = client_for(redis_url)
    tenant = f"t-{unique}"
    with pytest.raises(PriorityError, match="priority must be a whole number from 0 to 9") as e:
        client.submit(tenant, USER, "support", GOAL, {}, queue=f"q-{unique}", priority=priority)
    assert "\n" not in str(e.value)
    _nothing_written(client.client, tenant)


@pytest.mark.parametrize("value", ["10", "-1", "abc", "5.5", ""])
def test_the_cli_refuses_a_priority_that_is_not_0_to_9(
    redis_url: str, unique: str, value: str
) -> None:
    tenant = f"t-{unique}"
    result = runner.invoke(
        app, ["submit", "--job", "support", "--tenant", tenant, "--user", USER, "--goal", GOAL,
              "--priority", value],
        env={"TURNSTILE_REDIS_URL": redis_url},
    )  # fmt: skip
    assert result.exit_code == 2, result.output
    assert "--priority" in result.stderr and result.stderr.count("\n") == 1, result.stderr
    assert "Traceback" not in result.output and "╭" not in result.output
    _nothing_written(redis.Redis.from_url(redis_url), tenant)


@pytest.fixture(scope="module")
def api(redis_url: str) -> Iterator[ApiServer]:
    with running_api(redis_url) as server:
        yield server


@pytest.mark.parametrize("priority", BAD, ids=[repr(p) for p in BAD])
def test_http_refuses_a_priority_that_is_not_0_to_9(
    redis_url: str, api: ApiServer, unique: str, priority: Any
) -> None:
    """A priority over HTTP is a JSON integer from 0 to 9: 10, -1, true, 5.0, "5", null each
    get a one-line 422 problem naming the field, and nothing is written."""
    tenant = f"t-{unique}"
    body = {
        "user": USER,
        "goal": GOAL,
        "job": "support",
        "queue": f"q-{unique}",
        "priority": priority,
    }
    with http(api, make_key(redis_url, tenant)) as web:
        reply = web.post("/v1/runs", json=body)
    assert reply.status_code == 422, reply.text
    problem = reply.json()
    assert problem["code"] == "invalid_request" and "priority" in problem["detail"]
    assert "\n" not in problem["detail"]
    store = redis.Redis.from_url(redis_url)
    assert store.zcard(keys.runs(tenant)) == 0 and not store.sismember(keys.TENANTS, tenant)


def test_the_priority_is_stored_and_shown(redis_url: str, api: ApiServer, unique: str) -> None:
    """Submitted over HTTP with 8, with the CLI with 1, or with none (5): `status`, `runs`
    and GET /v1/runs show it; a second submission of the same key with another priority is
    another submission (409), with the same one the same run."""
    tenant, queue = f"t-{unique}", f"nobody-{unique}"
    env = {"TURNSTILE_REDIS_URL": redis_url}
    with http(api, make_key(redis_url, tenant)) as web:
        body = {
            "user": USER,
            "goal": GOAL,
            "job": "support",
            "queue": queue,
            "priority": 8,
            "run_id": "k1",
        }
        made = web.post("/v1/runs", json=body)
        assert made.status_code == 202, made.text
        run_id = made.json()["run_id"]
        assert web.get(f"/v1/runs/{run_id}").json()["priority"] == 8
        assert web.post("/v1/runs", json=body).json()["created"] is False
        assert web.post("/v1/runs", json={**body, "priority": 7}).status_code == 409
        plain = web.post(
            "/v1/runs", json={"user": USER, "goal": GOAL, "job": "support", "queue": queue}
        )
        assert web.get(f"/v1/runs/{plain.json()['run_id']}").json()["priority"] == 5
    result = runner.invoke(app, ["submit", "--job", "support", "--tenant", tenant, "--user",
                                 USER, "--goal", GOAL, "--queue", queue, "--priority", "1"],
                           env=env)  # fmt: skip
    assert result.exit_code == 0, result.output
    low = result.stdout.strip()
    shown = runner.invoke(app, ["status", low, "--json"], env=env)
    assert json.loads(shown.stdout)["priority"] == 1
    table = runner.invoke(app, ["status", low], env=env).stdout
    cells = [line.replace("│", " ").split() for line in table.splitlines()]
    assert ["priority", "1"] in cells, table
    listed = runner.invoke(app, ["runs", "--tenant", tenant, "--json"], env=env)
    by_id = {r["run_id"]: r["priority"] for r in json.loads(listed.stdout)["runs"]}
    assert by_id == {run_id: 8, plain.json()["run_id"]: 5, low: 1}
