"""A support run on a real model's wire format through real Celery worker processes: it
completes, the ledger holds the provider's usage at the table's prices, and the run replays
from its trace to the identical state with the provider gone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.integration.workers import client_for, running_workers, settled, shop_effects, wait_until
from tests.wire.wire import MODELS, otlp_receiver, wire_server
from turnstile.errors import SubmissionError
from turnstile.jobs.outcomes import Outcome
from turnstile.jobs.support.scenarios import GOAL, USER
from turnstile.worker.ops.replay import replay_run
from turnstile.worker.store import keys

pytestmark = pytest.mark.integration

EMAIL_COST_MICROUSD = 50  # send_status_email's declared cost bound
BUDGET = {"max_tokens": 40_000, "max_tool_calls": 8}


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_a_support_run_on_a_provider_completes_through_workers_and_replays(
    redis_url: str, provider: str
) -> None:
    """Five turns over two worker processes against the provider's wire format: completed, one
    refund and one email, ledger = provider usage at table prices, and replay matches."""
    queue, tenant = f"q-{uuid.uuid4().hex[:8]}", f"t-{uuid.uuid4().hex[:8]}"
    client = client_for(redis_url)
    client.ledger.set_ceiling(tenant, "cost_microusd", 5_000_000)
    with wire_server(provider, "support_run") as wire:
        # The default leases, not the tests' 3 s ones: this test counts the provider's requests,
        # and on a loaded machine a step not picked up within 3 s is rightly sent again, a
        # second model call the test would count (test_worker.py drills the leases).
        leases = {"TURNSTILE_PICKUP_LEASE_S": "60", "TURNSTILE_INFLIGHT_LEASE_S": "15"}
        with running_workers(redis_url, [queue], 2, env={**wire.env, **leases}):
            run_id = client.submit(
                tenant, USER, "support", GOAL, {"model": MODELS[provider]}, budget=BUDGET,
                queue=queue,
            )  # fmt: skip
            wait_until(lambda: settled(client, [run_id]), timeout_s=60, what="the run to end")
        tokens, cost = wire.billed()
        asked = wire.received()
        # On a failure: each request's retry count (the SDK's own retries) and time, and the
        # run's turn events (a turn run twice shows as two deliveries of one version).
        assert len(asked) == 5, (
            [(r.get("headers", {}).get("x-stainless-retry-count"), round(r["t"], 2))
             for r in asked],
            [(e["type"], e.get("version"), e.get("at"))
             for _, e in client.store.events(tenant, run_id)],
        )  # fmt: skip
    state = client.state(run_id)
    assert state.outcome is Outcome.COMPLETED, state.reason
    assert shop_effects(client, run_id) == [
        ["refund", "ord_1001", 3000],
        ["email", "ord_1001"],
    ]
    ledger = client.ledger.read(tenant)
    assert ledger["tokens"].committed == tokens == state.usage.tokens
    assert ledger["cost_microusd"].committed == cost + EMAIL_COST_MICROUSD
    assert ledger["cost_microusd"].reserved == 0
    replayed = replay_run(client, run_id)  # the wire server is gone: no network
    assert replayed.matches, (replayed.difference, replayed.notes)
    assert replayed.turns == 5


def test_submit_refuses_a_bad_model_string_and_an_unpriced_model_under_a_cost_ceiling(
    redis_url: str, unique: str
) -> None:
    """An unknown provider prefix is refused at submit; so is a model with no price for a
    tenant with a cost ceiling, while a tenant without one may run it. Nothing is written."""
    client = client_for(redis_url)
    tenant, queue = f"t-{unique}", f"q-{unique}"  # no workers: the runs only wait
    with pytest.raises(SubmissionError, match="unknown provider 'gemini'"):
        client.submit(tenant, USER, "support", GOAL, {"model": "gemini:pro"}, queue=queue)
    client.ledger.set_ceiling(tenant, "cost_microusd", 1_000_000)
    with pytest.raises(SubmissionError, match="has no price"):
        client.submit(
            tenant, USER, "support", GOAL, {"model": "openai:my-local-llama"}, queue=queue,
            run_id=f"run-{unique}",
        )  # fmt: skip
    with pytest.raises(Exception, match="no run"):
        client.state(f"run-{unique}")
    other = client.submit(
        f"free-{unique}", USER, "support", GOAL, {"model": "openai:my-local-llama"}, queue=queue
    )
    chosen = client.state(other).budget
    assert chosen.input_microusd_per_mtok == 0
    assert chosen.max_tokens == 40_000  # the job's default, raised for a real model


TYPO_SAID = (
    "unknown model 'openai:gpt-4.1-mnii': did you mean openai:gpt-4.1-mini? (a model this "
    "process does not know yet is added, with its price, to the file named in "
    "TURNSTILE_PRICES_FILE)"
)


@pytest.mark.parametrize("ceiling", [True, False], ids=["cost ceiling", "no ceiling"])
def test_a_typed_model_is_refused_naming_the_closest_for_every_tenant(
    redis_url: str, ceiling: bool
) -> None:
    """`openai:gpt-4.1-mnii`, the run's model or its fallback, is refused as an unknown model
    with the closest known name, whether its tenant has a cost ceiling (it was told to add a
    price) or not (it was accepted); nothing is written."""
    client = client_for(redis_url)
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    if ceiling:
        client.ledger.set_ceiling(tenant, "cost_microusd", 1_000_000)
    for params in ({"model": "openai:gpt-4.1-mnii"}, {"fallback_model": "openai:gpt-4.1-mnii"}):
        run_id = f"run-{uuid.uuid4().hex[:12]}"
        with pytest.raises(SubmissionError) as refused:
            client.submit(tenant, USER, "support", GOAL, params, queue=f"idle-{tenant}",
                          run_id=run_id)  # fmt: skip
        assert str(refused.value) == TYPO_SAID
        assert client.client.hget(keys.RUN_TENANTS, run_id) is None
    assert client.client.zcard(keys.runs(tenant)) == 0


@pytest.mark.slow  # over 14 s on 2 cores: CI runs it in the slow part
def test_turns_on_two_workers_export_one_trace_over_otlp_with_genai_attributes(
    redis_url: str,
) -> None:
    """With TURNSTILE_OTLP_ENDPOINT set, every turn's spans reach an OTLP/HTTP receiver under
    one trace id, children of the run's own span, though the turns ran on two worker processes
    one after the other; model spans carry the GenAI attributes with the provider's usage,
    tool spans the tool name."""
    queue, tenant = f"q-{uuid.uuid4().hex[:8]}", f"t-{uuid.uuid4().hex[:8]}"
    client = client_for(redis_url)
    with otlp_receiver() as receiver, wire_server("openai", "support_run", delay_s=0.5) as wire:
        env = {**wire.env, "TURNSTILE_OTLP_ENDPOINT": receiver.endpoint}
        with running_workers(redis_url, [queue], 1, env=env, prefix="first"):
            run_id = client.submit(
                tenant, USER, "support", GOAL, {"model": MODELS["openai"]}, budget=BUDGET,
                queue=queue,
            )  # fmt: skip
            wait_until(lambda: client.state(run_id).usage.steps >= 2, what="two turns")
        assert client.state(run_id).status.value == "running"  # the rest is for the second
        with running_workers(redis_url, [queue], 1, env=env, prefix="second"):
            wait_until(lambda: settled(client, [run_id]), timeout_s=60, what="the run to end")
        wait_until(
            lambda: (
                sum(s["name"].startswith("chat ") for s in receiver.spans()) == 5
                and any(s["name"] == "invoke_agent support" for s in receiver.spans())
            ),
            what="five model spans and the run's span at the receiver",
        )
        spans = [s for s in receiver.spans() if s["attributes"]["turnstile.run_id"] == run_id]
        tokens, _ = wire.billed()
    assert client.state(run_id).outcome is Outcome.COMPLETED
    assert len({s["trace_id"] for s in spans}) == 1
    turns = [s for s in spans if s["attributes"]["turnstile.kind"] == "turn"]
    assert len({s["resource"]["process.pid"] for s in turns}) == 2
    [root] = [s for s in spans if s["attributes"]["turnstile.kind"] == "run"]
    assert root["parent_span_id"] == ""
    assert {s["parent_span_id"] for s in turns} == {root["span_id"]}
    assert root["attributes"]["gen_ai.operation.name"] == "invoke_agent"
    assert root["attributes"]["turnstile.outcome"] == "completed"
    by_id = {s["span_id"]: s for s in spans}
    models = [s for s in spans if s["name"].startswith("chat ")]
    for span in models:
        attrs = span["attributes"]
        assert attrs["gen_ai.operation.name"] == "chat"
        assert attrs["gen_ai.provider.name"] == "openai"
        assert attrs["gen_ai.request.model"] == "gpt-4.1-mini"
        assert attrs["gen_ai.response.model"] == "gpt-4.1-mini-2025-04-14"
        assert by_id[span["parent_span_id"]]["attributes"]["turnstile.kind"] == "turn"
    assert (
        sum(
            s["attributes"]["gen_ai.usage.input_tokens"]
            + s["attributes"]["gen_ai.usage.output_tokens"]
            for s in models
        )
        == tokens
    )
    tools = sorted(
        s["attributes"]["gen_ai.tool.name"]
        for s in spans
        if s["attributes"].get("gen_ai.operation.name") == "execute_tool"
    )
    assert tools == ["get_order", "issue_refund", "send_status_email"]


def test_the_demo_runs_the_support_job_on_a_model_and_refuses_a_missing_key() -> None:
    """`turnstile demo --model openai:...` runs a support run on the provider's wire format to
    completed; without the key it stops at once with one line naming the variable."""
    bindir = Path(sys.executable).parent
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TURNSTILE_", "OPENAI_"))}
    command = [str(bindir / "turnstile"), "demo", "--model", MODELS["openai"], "--runs", "0"]
    refused = subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert refused.returncode != 0
    assert "OPENAI_API_KEY" in refused.stderr and "Traceback" not in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    with wire_server("openai", "support_run") as wire:
        out = subprocess.run(
            [*command, "--json"], env={**env, **wire.env}, capture_output=True, text=True,
            timeout=240, check=False,
        )  # fmt: skip
        tokens, cost = wire.billed()
    assert out.returncode == 0, out.stderr[-3000:]
    [run] = json.loads(out.stdout)["runs"]
    assert run["outcome"] == "completed"
    assert (run["tokens"], run["cost_microusd"]) == (tokens, cost + EMAIL_COST_MICROUSD)
    assert run["effects"] == [["refund", "ord_1001", 3000], ["email", "ord_1001"]]
