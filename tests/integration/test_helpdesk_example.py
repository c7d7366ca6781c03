"""The example helpdesk job (examples/helpdesk) on an OpenAI-compatible "local server", as its
README sets one up: a named endpoint with no key, made the job's default model by
HELPDESK_MODEL, served here by the wire server's agent; through a real worker process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.workers import client_for, running_workers, settled, wait_until
from tests.wire.wire import wire_server
from turnstile.jobs.outcomes import Outcome
from turnstile.worker.ops.replay import replay_run

pytestmark = pytest.mark.integration

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "helpdesk"
SCRIPT = {"agent": {"args": {"get_order": {"order_id": "A-100"},
                             "search_faq": {"topic": "delivery"}}}}  # fmt: skip


def test_the_helpdesk_example_runs_on_a_local_server_named_as_an_endpoint(
    redis_url: str, unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without HELPDESK_MODEL the job's model is openai:gpt-4.1-mini; with the README's
    `ollama` endpoint and HELPDESK_MODEL=ollama:llama3.1:8b a run completes on the local
    server (asked for that model, with no key of the user's), every turn says the endpoint
    answered, and the run replays to the same state with the server gone."""
    monkeypatch.syspath_prepend(str(EXAMPLE))
    monkeypatch.delenv("HELPDESK_MODEL", raising=False)
    from turnstile_helpdesk import helpdesk  # noqa: PLC0415 - on the path only for this test

    assert helpdesk().model == "openai:gpt-4.1-mini"
    tenant, queue = f"t-{unique}", f"q-{unique}"
    with wire_server("openai", script=SCRIPT) as local:
        env = {
            "TURNSTILE_JOBS": "turnstile_helpdesk:helpdesk",
            "TURNSTILE_MODEL_ENDPOINTS": json.dumps({"ollama": {
                "base_url": local.base_url, "key_env": None,
                "prices": {"llama3.1:8b": {"input": 0, "output": 0}}}}),
            "HELPDESK_MODEL": "ollama:llama3.1:8b",
        }  # fmt: skip
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        client = client_for(redis_url)
        client.ledger.set_ceiling(tenant, "cost_microusd", 1_000_000)  # the model is priced
        worker_env = {**env, "PYTHONPATH": str(EXAMPLE)}
        with running_workers(redis_url, [queue], 1, env=worker_env):
            run_id = client.submit(tenant, "u1", "helpdesk", "Where is my order A-100?",
                                   {"order_id": "A-100"}, queue=queue)  # fmt: skip
            wait_until(lambda: settled(client, [run_id]), timeout_s=60, what="the run to end")
        received = local.received()
    state = client.state(run_id)
    assert state.outcome is Outcome.COMPLETED, (state.reason, state.last_result)
    assert state.facts["order_status"] == "shipped" and state.facts["replied"] is True
    assert {r["body"]["model"] for r in received} == {"llama3.1:8b"}
    assert {r["headers"].get("authorization") for r in received} == {"Bearer no-key"}
    turns = [e for _, e in client.store.events(tenant, run_id) if e["type"] == "turn"]
    assert {e["model"] for e in turns} == {"ollama:llama3.1:8b"}
    replayed = replay_run(client, run_id)
    assert replayed.matches, (replayed.difference, replayed.notes)
