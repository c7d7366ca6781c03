"""Provider rate limits through real workers against the wire-format provider: a turn over its
endpoint's bucket is deferred (an event, `status`, a metric) and completes later; a claimed
turn (eager continuation) draws too; a limit set at a sliding window's own figure meets no 429;
a 429 met by one worker keeps the other from calling the provider until the wait is over; a
run whose deadline would pass while it waits ends budget_exhausted (deadline) naming the wait;
`limits show` never shows a remainder below zero; bad limits are one-line refusals, on the
command line and over HTTP, with nothing written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from typing import Any

import pytest
from typer.testing import CliRunner

from tests.integration.apiserver import http, make_key, running_api
from tests.integration.test_metrics import free_port, scrape, value
from tests.integration.workers import client_for, running_workers, settled, wait_until
from tests.wire.wire import exchanges, wire_server
from turnstile.jobs.outcomes import Outcome
from turnstile.jobs.support.scenarios import GOAL, USER
from turnstile.worker.cli.main import app
from turnstile.worker.client._client import Client
from turnstile.worker.http.apikeys import Role
from turnstile.worker.scheduling import ratelimits
from turnstile.worker.store import keys

pytestmark = pytest.mark.integration

runner = CliRunner()

# A provider that answers every request with a final answer: one-turn runs of any job.
FINAL = exchanges("openai", "support_run")[-1]
LONG = {"max_tokens": 40_000, "deadline_ms": 120_000}


def _names() -> tuple[str, str, str]:
    u = uuid.uuid4().hex[:8]
    # An endpoint of this test alone: other tests' runs on the same server are not limited.
    return f"q-{u}", f"t-{u}", f"openai:rl-{u}"


def _events(client: Client, tenant: str, run_id: str, kind: str) -> list[dict[str, Any]]:
    return [e for _, e in client.store.events(tenant, run_id) if e["type"] == kind]


def _turnstile(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("TURNSTILE_")}
    return subprocess.run(
        [sys.executable, "-c", "from turnstile.worker.cli.main import main; main()", *args],
        env={**base, **env}, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


@pytest.mark.slow  # over 14 s on 2 cores: CI runs it in the slow part
def test_a_turn_over_the_bucket_is_deferred_shown_and_counted_then_completes(
    redis_url: str,
) -> None:
    """rpm=12 burst_s=30, 8 one-turn runs: the first six (the burst) call the provider at once
    (or about: the bucket refills one every 61/7 s), the others are deferred (a `rate_limited`
    event, a `waiting` row in `turnstile status`, the deferral metric) and call it after their
    wait, each once; every run completes, and nothing is left held."""
    queue, tenant, endpoint = _names()
    client = client_for(redis_url)
    ratelimits.set_limits(
        client.client, endpoint, {"rpm": 12, "burst_s": 30}, providers=client.config.providers
    )
    port = free_port()
    with wire_server("openai", script={"always": FINAL}) as wire:
        env = {**wire.env, "TURNSTILE_METRICS_PORT": str(port)}
        with running_workers(redis_url, [queue], 1, env=env, concurrency=2):
            run_ids = [
                client.submit(
                    tenant, USER, "support", GOAL, {"model": endpoint}, budget=LONG, queue=queue
                )
                for _ in range(8)
            ]
            wait_until(
                lambda: any(
                    client.run_hash(r)[1]["status"] == "running"
                    and _events(client, tenant, r, "rate_limited")
                    for r in run_ids
                ),
                what="a run deferred and still waiting",
            )
            waiting = next(r for r in run_ids if _events(client, tenant, r, "rate_limited"))
            # `turnstile status`, run in this process: a new process's start may outlast a wait.
            shown = runner.invoke(app, ["status", waiting], env={"TURNSTILE_REDIS_URL": redis_url})
            wait_until(lambda: settled(client, run_ids), timeout_s=120, what="every run to end")
            samples = scrape(port)
        asked = wire.received()
    assert shown.exit_code == 0, shown.output
    assert f"for the rate limit of {endpoint} (rpm) until" in shown.output, shown.output
    assert [client.state(r).outcome for r in run_ids] == [Outcome.COMPLETED] * 8
    deferred = {r: _events(client, tenant, r, "rate_limited") for r in run_ids}
    events = [e for evs in deferred.values() for e in evs]
    assert 1 <= len(events) <= 2, deferred
    assert all(e["limit"] == "rpm" and e["endpoint"] == endpoint for e in events)
    assert all(0 < e["wait_ms"] <= 20_000 for e in events), events
    assert len(asked) == 8  # each run called the provider once: a deferred turn did not
    # The wait counts as active time: the deferred runs' usage shows it.
    for run_id, evs in deferred.items():
        if evs:
            assert client.state(run_id).usage.elapsed_ms >= evs[0]["wait_ms"]
    labels = {"endpoint": endpoint, "limit": "rpm"}
    assert value(samples, "turnstile_rate_limit_deferred_total", **labels) == len(events)
    # Nothing is left behind: no deferred step, no turn in flight, no hold.
    assert client.client.zcard(keys.deferred(tenant)) == 0
    assert client.client.zcard(keys.slots(tenant)) == 0
    assert all(f.reserved == 0 for f in client.ledger.read(tenant).values())


@pytest.mark.slow  # over 14 s on 2 cores: CI runs it in the slow part
def test_a_turn_claimed_by_eager_continuation_draws_from_the_bucket_too(redis_url: str) -> None:
    """A five-turn run with rpm=8 burst_s=30: its first four turns go (the burst; later ones
    claimed by the commit before), the fifth, claimed too, is deferred by the bucket (a request
    refills every 61/5 s), holding no worker, and the run completes."""
    queue, tenant, endpoint = _names()
    client = client_for(redis_url)
    ratelimits.set_limits(
        client.client, endpoint, {"rpm": 8, "burst_s": 30}, providers=client.config.providers
    )
    with wire_server("openai", "support_run") as wire:
        with running_workers(redis_url, [queue], 1, env=wire.env):
            run_id = client.submit(
                tenant, USER, "support", GOAL, {"model": endpoint}, budget=LONG, queue=queue
            )
            wait_until(lambda: settled(client, [run_id]), timeout_s=90, what="the run to end")
        asked = wire.received()
    assert client.state(run_id).outcome is Outcome.COMPLETED
    turns = _events(client, tenant, run_id, "turn")
    deferred = _events(client, tenant, run_id, "rate_limited")
    assert deferred and all(e["limit"] == "rpm" and e["step"] >= 5 for e in deferred), deferred
    # The turn deferred was claimed by the commit before it (eager), and drew all the same.
    assert deferred[0]["eager"] is True and 0 < deferred[0]["wait_ms"] <= 15_000
    assert len(turns) == 5
    assert len(asked) == 5


@pytest.mark.slow
def test_a_limit_at_a_sliding_windows_own_figure_meets_no_429(redis_url: str) -> None:
    """The provider answers at most 40 requests in any 60 s (a sliding window), and the limit
    is set at its own figure, rpm=40, with the default burst. 44 one-turn runs at once: the
    first goes, the others at 40 per 61 s, and the provider answers none of them 429; every run
    completes, each calling the provider once. (With a minute's worth at once, the bucket
    before `burst_s`, the 41st call met a 429 a second and a half in.)"""
    queue, tenant, endpoint = _names()
    client = client_for(redis_url)
    ratelimits.set_limits(client.client, endpoint, {"rpm": 40}, providers=client.config.providers)
    with wire_server("openai", script={"always": FINAL, "rpm": 40, "window": "sliding"}) as wire:
        with running_workers(redis_url, [queue], 1, env=wire.env, concurrency=2):
            run_ids = [
                client.submit(
                    tenant, USER, "support", GOAL, {"model": endpoint}, budget=LONG, queue=queue
                )
                for _ in range(44)
            ]
            wait_until(lambda: settled(client, run_ids), timeout_s=180, what="every run to end")
        asked = wire.received()
    refused = [round(x["t"] - asked[0]["t"], 1) for x in asked if x.get("limited")]
    assert refused == [], f"429s at {refused} s"
    assert len(asked) == 44
    assert [client.state(r).outcome for r in run_ids] == [Outcome.COMPLETED] * 44
    span_s = asked[-1]["t"] - asked[0]["t"]
    assert span_s >= 43 * 60 / 40  # the provider's pace, at most; the bucket's is 40 per 61 s


@pytest.mark.slow  # over 14 s on 2 cores: CI runs it in the slow part
def test_a_429_on_one_worker_keeps_the_other_from_calling_the_provider_until_its_wait_ends(
    redis_url: str,
) -> None:
    """The provider allows 4 requests a minute (then one every 15 s); our limit is far above
    it. Worker A, alone on its queue, runs five runs: the fifth call meets a 429, which blocks
    the endpoint's bucket in the store while A waits in its retry. Worker B, alone on another
    queue, then gets a run: it defers it on the 429 without calling the provider. No request
    reaches the provider during the wait but one already on its way, and every run completes."""
    queue_a, tenant, endpoint = _names()
    queue_b = f"{queue_a}-b"
    client = client_for(redis_url)
    ratelimits.set_limits(client.client, endpoint, {"rpm": 1000}, providers=client.config.providers)

    def submit(queue: str) -> str:
        return client.submit(
            tenant, USER, "support", GOAL, {"model": endpoint}, budget=LONG, queue=queue
        )

    with wire_server("openai", script={"always": FINAL, "rpm": 4}) as wire:
        with (
            running_workers(redis_url, [queue_a], 1, env=wire.env, prefix="a") as (a,),
            running_workers(redis_url, [queue_b], 1, env=wire.env, prefix="b") as (b,),
        ):
            run_ids = [submit(queue_a) for _ in range(5)]
            wait_until(
                lambda: any(x.get("limited") for x in wire.received()),
                what=lambda: f"a 429 from the provider; it received {wire.received()}",
            )
            run_ids.append(submit(queue_b))
            wait_until(lambda: settled(client, run_ids), timeout_s=150, what="every run to end")
            logs = {w: (w.events("rate_blocked"), w.events("rate_limit_deferred")) for w in (a, b)}
        asked = wire.received()
    assert [client.state(r).outcome for r in run_ids] == [Outcome.COMPLETED] * 6
    first = min(x["t"] for x in asked if x.get("limited"))
    during = [x for x in asked if first + 0.5 < x["t"] < first + 13.0]
    assert during == [], (first, [(round(x["t"] - first, 2), x.get("limited")) for x in asked])
    # A met the 429; B deferred its run on it, read from the store, without a 429 of its own
    # before (each worker is its own process).
    a_blocked, _ = logs[a]
    b_blocked, b_deferred = logs[b]
    assert a_blocked, logs
    own_first = min((x["timestamp"] for x in b_blocked), default="~")
    on_429 = [d for d in b_deferred if d["limit"] == "429" and d["timestamp"] < own_first]
    assert on_429, logs[b]


def test_a_run_whose_deadline_would_pass_while_it_waits_ends_budget_exhausted_naming_the_wait(
    redis_url: str,
) -> None:
    queue, tenant, endpoint = _names()
    client = client_for(redis_url)
    ratelimits.set_limits(client.client, endpoint, {"rpm": 1}, providers=client.config.providers)
    with wire_server("openai", script={"always": FINAL}) as wire:
        with running_workers(redis_url, [queue], 1, env=wire.env):
            first = client.submit(
                tenant, USER, "support", GOAL, {"model": endpoint}, budget=LONG, queue=queue
            )
            wait_until(lambda: settled(client, [first]), what="the first run to end")
            short = client.submit(
                tenant, USER, "support", GOAL, {"model": endpoint},
                budget={"max_tokens": 40_000, "deadline_ms": 5_000}, queue=queue,
            )  # fmt: skip
            wait_until(lambda: settled(client, [short]), what="the second run to end")
        asked = wire.received()
    state = client.state(short)
    assert (state.outcome, state.detail) == (Outcome.BUDGET_EXHAUSTED, "deadline")
    assert f"rate limit of {endpoint} (rpm)" in (state.reason or "")
    assert "deadline would pass while it waits" in (state.reason or "")
    [event] = _events(client, tenant, short, "rate_limited")
    assert event["ended"] is True and event["wait_ms"] > 5_000
    assert len(asked) == 1  # the second run never called the provider
    assert all(f.reserved == 0 for f in client.ledger.read(tenant).values())


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["openai:gpt-4.1-mini", "rpm=0"], "rpm must be a whole number from 1"),
        (["openai:gpt-4.1-mini", "rpm=-3"], "rpm must be a whole number from 1"),
        (["openai:gpt-4.1-mini", "tpm=many"], "tpm must be a whole number from 1"),
        (["gemini:pro", "rpm=10"], "unknown endpoint 'gemini:pro'"),
        (["openai:gpt-4.1-mini", "rpm=5", "--tenant", "bad tenant"], "tenant"),
    ],
)
def test_bad_limits_on_the_command_line_are_one_line_with_nothing_written(
    redis_url: str, args: list[str], said: str
) -> None:
    client = client_for(redis_url)
    before = client.client.smembers(keys.RATE_ENDPOINTS)
    result = _turnstile("limits", "set", *args, TURNSTILE_REDIS_URL=redis_url)
    assert result.returncode == 1, result
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1, result.stderr
    assert said in result.stderr and "Traceback" not in result.stderr
    assert client.client.smembers(keys.RATE_ENDPOINTS) == before
    assert not client.client.exists(keys.rate_bucket(args[0]))


def test_limits_set_show_unset_on_the_command_line(redis_url: str) -> None:
    _, tenant, endpoint = _names()
    env = {"TURNSTILE_REDIS_URL": redis_url}
    said = _turnstile("limits", "set", endpoint, "rpm=500", "tpm=200000", **env)
    assert said.stdout.strip() == f"limits of {endpoint}: rpm=500 tpm=200000", said.stderr
    _turnstile("limits", "set", endpoint, "rpm=50", "--tenant", tenant, **env)
    shown = _turnstile("limits", "show", endpoint, "--json", **env)
    rows = {(r["tenant"], r["rpm"], r["tpm"]) for r in json.loads(shown.stdout)}
    assert rows == {("", 500, 200000), (tenant, 50, None)}
    gone = _turnstile("limits", "unset", endpoint, **env)
    assert gone.stdout.strip() == f"limits of {endpoint}: removed rpm and tpm"
    _turnstile("limits", "unset", endpoint, "--tenant", tenant, **env)
    assert _turnstile("limits", "show", endpoint, "--json", **env).stdout.strip() == "[]"


def test_limits_show_never_shows_a_remainder_below_zero(redis_url: str) -> None:
    """Turns deferred on a bucket take it below zero (their debt): `limits show`, its --json
    and `GET /v1/limits` say 0 requests left (and the deferred turn), never `-0.2`."""
    _, tenant, endpoint = _names()
    client = client_for(redis_url)
    # The deferred draws wait about 30 s and 61 s: still deferred when shown, however slowly
    # the commands start on a loaded machine.
    ratelimits.set_limits(client.client, endpoint, {"rpm": 2}, providers=client.config.providers)
    buckets = ratelimits.Buckets(client.client)
    kinds = [buckets.draw(endpoint, tenant, f"r{n}", 1, tokens=1, longest_ms=600_000).kind
             for n in range(3)]  # fmt: skip
    assert kinds == ["go", "wait", "wait"]  # the level is near -2 now
    env = {"TURNSTILE_REDIS_URL": redis_url, "COLUMNS": "200"}
    table = _turnstile("limits", "show", endpoint, **env)
    [row] = [line for line in table.stdout.splitlines() if endpoint in line]
    cells = [c.strip() for c in row.strip("│┃ ").split("│")]
    assert cells[1:6] == ["-", "2", "-", "1", "0"], cells
    assert not any(c.startswith("-") and c != "-" for c in cells), cells
    [shown] = json.loads(_turnstile("limits", "show", endpoint, "--json", **env).stdout)
    assert (shown["requests_left"], shown["burst_s"], shown["deferred"]) == (0, 1, 2)
    with running_api(redis_url) as api, http(api, make_key(redis_url, tenant, Role.OPERATOR)) as op:
        rows = op.get("/v1/limits").json()["limits"]
    [mine] = [r for r in rows if r["endpoint"] == endpoint]
    assert mine["requests_left"] == 0


def test_limits_over_http_need_an_operator_key_and_refuse_bad_limits_with_nothing_written(
    redis_url: str,
) -> None:
    _, tenant, endpoint = _names()
    client = client_for(redis_url)
    with running_api(redis_url) as api:
        with http(api, make_key(redis_url, tenant)) as service:
            assert service.get("/v1/limits").status_code == 403
            refused = service.put(f"/v1/limits/{endpoint}", json={"rpm": 5})
            assert refused.status_code == 403
        with http(api, make_key(redis_url, tenant, Role.OPERATOR)) as operator:
            for body, code in [
                ({"rpm": 0}, "invalid_request"), ({"rpm": -1}, "invalid_request"),
                ({"tpm": "5"}, "invalid_request"), ({}, "invalid_limit"),
                ({"rpm": 5, "burst": 2}, "unknown_field"),
                ({"rpm": 5, "burst_s": 31}, "invalid_request"),
                ({"burst_s": 5}, "invalid_limit"),
            ]:  # fmt: skip
                reply = operator.put(f"/v1/limits/{endpoint}", json=body)
                assert (reply.status_code, reply.json()["code"]) == (422, code), reply.json()
            unknown = operator.put("/v1/limits/gemini:pro", json={"rpm": 5})
            assert (unknown.status_code, unknown.json()["code"]) == (422, "invalid_limit")
            assert "unknown endpoint" in unknown.json()["detail"]
            assert not client.client.exists(keys.rate_bucket(endpoint))
            made = operator.put(f"/v1/limits/{endpoint}", json={"rpm": 120, "tpm": 90_000})
            assert made.status_code == 200
            [row] = made.json()["limits"]
            assert (row["endpoint"], row["rpm"], row["tpm"], row["burst_s"]) == (
                endpoint, 120, 90_000, 1,
            )  # fmt: skip
            burst = operator.put(f"/v1/limits/{endpoint}", json={"burst_s": 5})
            assert burst.status_code == 200 and burst.json()["limits"][0]["burst_s"] == 5
            assert endpoint in {r["endpoint"] for r in operator.get("/v1/limits").json()["limits"]}
            removed = operator.delete(f"/v1/limits/{endpoint}", params={"limit": "tpm"})
            assert removed.json()["removed"] == ["tpm"]
            assert operator.delete(f"/v1/limits/{endpoint}").json()["limits"] == []
