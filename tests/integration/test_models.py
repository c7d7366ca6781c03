"""Models for every job through real Celery workers and real wire-format servers: a job from
outside the project runs on `openai:`, `anthropic:` and on two named endpoints at once; a
fallback answers for a provider that keeps answering 503; a model that cannot be used is
refused at submit with nothing written; a model or a job that cannot be built in the worker
ends the run `error` at once with the exception's text."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from functools import partial
from typing import Any

import pytest
from typer.testing import CliRunner

from tests.integration.workers import client_for, running_workers, settled, wait_until
from tests.model_jobs import SPEC
from tests.wire.agent import USAGE
from tests.wire.wire import Wire, down, wire_server
from turnstile.errors import SubmissionError
from turnstile.jobs.outcomes import Outcome
from turnstile.worker.cli.main import app
from turnstile.worker.client._client import Client
from turnstile.worker.store import keys

pytestmark = pytest.mark.integration

USER, GOAL = "u1", "close ticket T-1"
ENDPOINTS = "TURNSTILE_MODEL_ENDPOINTS"
AGENT_SCRIPT = {"agent": {"off_plan": ["ticket_history"],
                          "args": {"find_ticket": {"ticket": "T-1"}}}}  # fmt: skip
TURNS = 5  # plan, find_ticket, ticket_history (it raises), close_ticket, final answer
# Endpoint prices (micro-dollars per million tokens) and the cost of one agent reply at them.
ALPHA_PRICE, BETA_PRICE = {"input": 1_000_000, "output": 2_000_000}, {"input": 0, "output": 0}
ALPHA_REPLY_MICROUSD = (USAGE["input"] * 1_000_000 + USAGE["output"] * 2_000_000) // 1_000_000


@pytest.fixture
def jobs_env(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The outside jobs registered in this process (the client's) and, returned, the workers'."""
    monkeypatch.setenv("TURNSTILE_JOBS", SPEC)
    return {"TURNSTILE_JOBS": SPEC}


def endpoints(alpha: Wire, beta: Wire) -> str:
    return json.dumps({
        "alpha": {"base_url": alpha.base_url, "key_env": "ALPHA_KEY",
                  "prices": {"m-a": ALPHA_PRICE}},
        "beta": {"base_url": beta.base_url, "format": "anthropic", "key_env": "BETA_KEY",
                 "prices": {"m-b": BETA_PRICE}},
    })  # fmt: skip


def turn_events(client: Client, tenant: str, run_id: str) -> list[dict[str, Any]]:
    return [e for _, e in client.store.events(tenant, run_id) if e["type"] == "turn"]


def tool_statuses(events: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(s["name"], s["status"]) for e in events for s in e["spans"] if s["kind"] == "tool"]


def sent_key(request: dict[str, Any]) -> str:
    """The key a request carried, in whichever header its SDK puts it."""
    headers = {k.lower(): v for k, v in request["headers"].items()}
    return str(headers.get("x-api-key") or headers["authorization"].removeprefix("Bearer "))


def nothing_written(client: Client, tenant: str, run_id: str) -> bool:
    return not client.client.exists(keys.run(tenant, run_id), keys.events(tenant, run_id)) and (
        client.client.hget(keys.RUN_TENANTS, run_id) is None
    )


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_an_outside_job_runs_on_a_provider_model_through_workers(
    redis_url: str, unique: str, provider: str, jobs_env: dict[str, str]
) -> None:
    """The desk job (its default model is openai:, the run may name anthropic:) drives its own
    tools through the wire server's agent: the raising tool is an observation, the run
    completes, every turn records the model that answered, and the usage is the provider's."""
    tenant, queue = f"t-{unique}", f"q-{unique}"
    client = client_for(redis_url)
    params = {} if provider == "openai" else {"model": "anthropic:claude-sonnet-4-6"}
    spec = "openai:gpt-4.1-mini" if provider == "openai" else "anthropic:claude-sonnet-4-6"
    with (
        wire_server(provider, script=AGENT_SCRIPT) as wire,
        running_workers(redis_url, [queue], 1, env={**jobs_env, **wire.env}),
    ):
        run_id = client.submit(tenant, USER, "desk", GOAL, params, queue=queue)
        said = [e.data for e in client.events(run_id, live=True, timeout_s=60) if e.live]
        wait_until(lambda: settled(client, [run_id]), timeout_s=60, what="the desk run to end")
        received = wire.received()
    state = client.state(run_id)
    assert state.outcome is Outcome.COMPLETED, (state.reason, state.last_result)
    assert len(received) >= TURNS  # a redelivered step may ask a turn twice
    assert {r["body"]["model"] for r in received} == {spec.partition(":")[2]}
    events = turn_events(client, tenant, run_id)
    assert [e["model"] for e in events] == [spec] * TURNS
    assert tool_statuses(events) == [
        ("find_ticket", "ok"), ("ticket_history", "tool_raised"), ("close_ticket", "ok"),
    ]  # fmt: skip
    # Its live output, read as it ran, as any job's: the tools' start, progress (find_ticket's
    # own note) and end, each tagged with its turn, and the answer's words, streamed.
    assert [(d["type"], d["tool"]) for d in said if d["type"] == "progress"] == [
        ("progress", "find_ticket")
    ]
    assert next(d for d in said if d["type"] == "progress")["note"] == "reading ticket T-1"
    assert "".join(d["text"] for d in said if d["type"] == "text") == state.answer
    assert state.facts["state"] == "open" and state.facts["closed"] is True
    assert state.usage.tokens == TURNS * (USAGE["input"] + USAGE["output"])


@pytest.mark.slow  # over 14 s on 2 cores: CI runs it in the slow part
def test_two_named_endpoints_serve_runs_at_once(
    redis_url: str, unique: str, jobs_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An OpenAI-format and an Anthropic-format server, each its own process, configured as
    named endpoints: a run on each completes at the same time, each server sees only its own
    model and key, and each run is charged at its endpoint's prices."""
    tenant, queue = f"t-{unique}", f"q-{unique}"
    with (
        wire_server("openai", script=AGENT_SCRIPT) as alpha,
        wire_server("anthropic", script=AGENT_SCRIPT) as beta,
    ):
        env = {ENDPOINTS: endpoints(alpha, beta), "ALPHA_KEY": "alpha-secret",
               "BETA_KEY": "beta-secret"}  # fmt: skip
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        client = client_for(redis_url)
        client.ledger.set_ceiling(tenant, "cost_microusd", 1_000_000)  # both are priced
        with running_workers(redis_url, [queue], 2, env={**jobs_env, **env}):
            on_alpha = client.submit(tenant, USER, "desk", GOAL, {"model": "alpha:m-a"},
                                     queue=queue)  # fmt: skip
            on_beta = client.submit(tenant, USER, "desk", GOAL, {"model": "beta:m-b"}, queue=queue)
            wait_until(lambda: settled(client, [on_alpha, on_beta]), timeout_s=60, what="both")
        seen_alpha, seen_beta = alpha.received(), beta.received()
    for run_id, spec in ((on_alpha, "alpha:m-a"), (on_beta, "beta:m-b")):
        state = client.state(run_id)
        assert state.outcome is Outcome.COMPLETED, (spec, state.reason)
        assert {e["model"] for e in turn_events(client, tenant, run_id)} == {spec}
    # A turn may be asked twice (a step redelivered while a busy worker held it): not fewer.
    assert len(seen_alpha) >= TURNS and len(seen_beta) >= TURNS
    assert {r["body"]["model"] for r in seen_alpha} == {"m-a"}
    assert {sent_key(r) for r in seen_alpha} == {"alpha-secret"}
    assert {r["body"]["model"] for r in seen_beta} == {"m-b"}
    assert {sent_key(r) for r in seen_beta} == {"beta-secret"}
    assert client.state(on_alpha).usage.cost_microusd == TURNS * ALPHA_REPLY_MICROUSD
    assert client.state(on_beta).usage.cost_microusd == 0


@pytest.mark.slow  # over 10 s on 2 cores: CI runs it in the slow part
def test_a_fallback_model_answers_for_a_provider_answering_503(
    redis_url: str, unique: str, jobs_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run's model answers every request 503; after its retries each turn is answered by
    the run's `fallback_model`, the run completes, and every turn's event and span say which
    model answered and why the first did not."""
    tenant, queue = f"t-{unique}", f"q-{unique}"
    with (
        wire_server("openai", script=down(503)) as alpha,
        wire_server("anthropic", script=AGENT_SCRIPT) as beta,
    ):
        env = {ENDPOINTS: endpoints(alpha, beta), "ALPHA_KEY": "a", "BETA_KEY": "b"}
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        client = client_for(redis_url)
        with running_workers(redis_url, [queue], 1, env={**jobs_env, **env}):
            run_id = client.submit(
                tenant, USER, "desk", GOAL, {"model": "alpha:m-a", "fallback_model": "beta:m-b"},
                queue=queue,
            )  # fmt: skip
            wait_until(lambda: settled(client, [run_id]), timeout_s=60, what="the run to end")
        refused, answered = alpha.received(), beta.received()
    state = client.state(run_id)
    assert state.outcome is Outcome.COMPLETED, state.reason
    assert len(answered) >= TURNS and len(refused) == 4 * len(answered)  # four attempts a turn
    events = turn_events(client, tenant, run_id)
    assert [e["model"] for e in events] == ["beta:m-b"] * TURNS
    assert all("alpha:m-a: alpha failed (503)" in e["fallback"] for e in events)
    assert all("gave up after 4 attempts" in e["fallback"] for e in events)
    spans = [s for e in events for s in e["spans"] if s["kind"] == "model"]
    assert {s["attrs"]["model"] for s in spans} == {"beta:m-b"}
    shown = CliRunner().invoke(app, ["trace", run_id, "--redis-url", redis_url])
    assert shown.exit_code == 0, shown.output
    model_lines = [line for line in shown.output.splitlines() if ".model model " in line]
    assert len(model_lines) >= TURNS
    assert all('"model": "beta:m-b"' in line and "503" in line for line in model_lines)


def test_a_model_that_cannot_be_used_is_refused_at_submit_with_nothing_written(
    redis_url: str, unique: str, jobs_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unknown endpoint, an endpoint whose key variable is not set, and an unpriced model
    (the run's or its fallback) for a tenant with a cost ceiling are each refused in one line
    before anything is written; the same unpriced model runs for a tenant without a ceiling."""
    monkeypatch.setenv(ENDPOINTS, json.dumps({
        "local": {"base_url": "http://127.0.0.1:9/v1"},
        "keyed": {"base_url": "http://127.0.0.1:9/v1", "key_env": "KEYED_KEY"},
    }))  # fmt: skip
    monkeypatch.delenv("KEYED_KEY", raising=False)
    client = client_for(redis_url)
    tenant, queue = f"t-{unique}", f"q-{unique}"  # no workers: an accepted run only waits
    client.ledger.set_ceiling(tenant, "cost_microusd", 1_000_000)
    cases = [
        ({"model": "vllm:llama"}, "unknown provider 'vllm' in model 'vllm:llama'"),
        ({"model": "keyed:m"}, "takes its key from KEYED_KEY, which is not set"),
        ({"model": "local:llama3"}, "model 'local:llama3' has no price"),
        ({"fallback_model": "local:llama3"}, "model 'local:llama3' has no price"),
        ({"model": "llama3"}, "params.model: 'llama3' is not a model string"),
    ]
    for i, (params, words) in enumerate(cases):
        run_id = f"run-{unique}-{i}"
        with pytest.raises(SubmissionError) as refused:
            client.submit(tenant, USER, "desk", GOAL, params, queue=queue, run_id=run_id)
        assert words in str(refused.value) and "\n" not in str(refused.value)
        assert nothing_written(client, tenant, run_id)
    free = client.submit(f"free-{unique}", USER, "desk", GOAL, {"model": "local:llama3"},
                         queue=queue)  # fmt: skip
    assert client.state(free).params["model"] == "local:llama3"
    command = [
        sys.executable, "-c", "from turnstile.worker.cli.main import main; main()", "submit",
        "--tenant", tenant, "--user", USER, "--job", "desk", "--goal", GOAL,
        "--param", "model=keyed:m", "--run-id", f"run-{unique}-cli",
    ]  # fmt: skip
    env = {**os.environ, "TURNSTILE_REDIS_URL": redis_url}
    out = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert out.stderr.count("\n") == 1 and "KEYED_KEY, which is not set" in out.stderr
    assert nothing_written(client, tenant, f"run-{unique}-cli")


def test_a_submission_reads_its_tenants_ledger_once(
    redis_url: str, unique: str, jobs_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A submission of an unpriced model reads its tenant's ledger once for both its checks
    (what the budget may ask for, whether the model may run unpriced), and is refused on it."""
    monkeypatch.setenv(ENDPOINTS, json.dumps({"local": {"base_url": "http://127.0.0.1:9/v1"}}))
    client = client_for(redis_url)
    tenant = f"t-{unique}"
    client.ledger.set_ceiling(tenant, "cost_microusd", 1_000_000)
    reads: list[str] = []
    read = client.ledger.read

    def counted(name: str) -> Any:
        reads.append(name)
        return read(name)

    monkeypatch.setattr(client.ledger, "read", counted)
    with pytest.raises(SubmissionError, match="has no price"):
        client.submit(tenant, USER, "desk", GOAL, {"model": "local:llama3"}, queue=f"q-{unique}")
    assert reads == [tenant]


@pytest.fixture
def failing_workers(
    redis_url: str, unique: str, jobs_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Client, str, Any]]:
    """One worker whose `broken_in_worker` factory raises and which knows no `gone` endpoint,
    while this process (the client) does."""
    monkeypatch.setenv(ENDPOINTS, json.dumps({"gone": {"base_url": "http://127.0.0.1:9/v1"}}))
    client = client_for(redis_url)
    queue = f"q-{unique}"
    env = {**jobs_env, "MODEL_JOBS_FAIL": "1", ENDPOINTS: ""}
    with running_workers(redis_url, [queue], 1, env=env) as [worker]:
        yield client, queue, worker


UNBUILDABLE = [
    ("raising_model", {}, "RuntimeError: the model registry is on fire"),
    ("not_a_model", {}, "returned dict, not a Model (an object with next(request))"),
    ("desk", {"model": "gone:m"}, "unknown provider 'gone' in model 'gone:m'"),
    ("broken_in_worker", {}, "RuntimeError: no credentials for the desk service"),
]


def test_a_model_or_job_that_cannot_be_built_ends_the_run_at_once(
    failing_workers: tuple[Client, str, Any], unique: str
) -> None:
    """A model factory that raises or returns something else, a model string the worker
    cannot use, and a job factory that raises in the worker each end the run `error` within
    5 s of its submission, with the exception's type and message as its one-line reason (not
    the delivery limit's), logged once with its traceback where it is the job's code."""
    client, queue, worker = failing_workers
    tenant = f"t-{unique}"
    for job, params, words in UNBUILDABLE:
        started = time.monotonic()
        run_id = client.submit(tenant, USER, job, GOAL, params, queue=queue)
        wait_until(partial(settled, client, [run_id]), timeout_s=30, what=f"{job} to end")
        took_s = time.monotonic() - started
        state_hash = client.run_hash(run_id)[1]
        assert took_s < 5.0, (job, took_s)
        assert state_hash["outcome"] == "error", (job, state_hash)
        reason = state_hash["reason"]
        assert words in reason and "\n" not in reason, (job, reason)
        assert "delivered" not in reason
    logged = worker.events("model_unbuildable")
    assert len(logged) == 3
    [raising] = [e for e in logged if "on fire" in e["reason"]]
    assert "Traceback" in raising["exception"] and "_raising_factory" in raising["exception"]
    assert not any("exception" in e for e in logged if "gone" in e["reason"])
