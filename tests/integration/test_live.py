"""Live output through real workers, the store and the HTTP API: a reader sees the answer's
words before the turn that holds them commits, a reader that hangs up mid-turn resumes by
Last-Event-ID with nothing lost and nothing twice, and a worker SIGKILLed mid-stream leaves
its attempt abandoned while the next attempt's words and one committed turn follow."""

from __future__ import annotations

import json
import threading
import uuid
from typing import Any

import pytest
from typer.testing import CliRunner

from tests.integration.apiserver import http, make_key, running_api, sse_events
from tests.integration.workers import client_for, running_workers, settled, wait_until
from tests.wire.wire import MODELS, wire_server
from turnstile.jobs.outcomes import Outcome
from turnstile.jobs.support.scenarios import GOAL, USER
from turnstile.worker.cli.main import app
from turnstile.worker.client import RunEvent
from turnstile.worker.store import live as live_store
from turnstile.worker.store.live import Cursor

pytestmark = pytest.mark.integration

BUDGET = {"max_tokens": 40_000, "max_tool_calls": 8}
LEASES = {"TURNSTILE_PICKUP_LEASE_S": "60", "TURNSTILE_INFLIGHT_LEASE_S": "15"}


def kept_text(events: list[Any], turn: int) -> str:
    """The words of `turn` a reader keeps: each `abandoned` of the turn drops those before."""
    kept: list[str] = []
    for event in events:
        data = event.data if isinstance(event, RunEvent) else event
        if not data.get("live") or data.get("turn") != turn:
            continue
        if data["type"] == "abandoned":
            kept = []
        elif data["type"] == "text":
            kept.append(data["text"])
    return "".join(kept)


def test_a_reader_sees_the_answer_before_its_turn_commits(redis_url: str) -> None:
    """A support run on the OpenAI wire format, its final answer streamed slowly: a live
    reader gets the answer's words in pieces, the last of them before the `turn` event that
    commits it, and they join to the committed answer; each tool call is said started and
    ended. A second run that nobody reads live is not streamed at all. Streamed or not, the
    ledger's tokens are the provider's usage exactly."""
    queue, tenant, alone = (f"{p}-{uuid.uuid4().hex[:8]}" for p in ("q", "t", "alone"))
    client = client_for(redis_url)
    with wire_server("openai", "slow_answer", by_turn=True) as wire:
        with running_workers(redis_url, [queue], 1, env={**wire.env, **LEASES}):
            run_id = client.submit(tenant, USER, "support", GOAL, {"model": MODELS["openai"]},
                                   budget=BUDGET, queue=queue)  # fmt: skip
            events = list(client.events(run_id, live=True, timeout_s=60))
            unread = client.submit(alone, USER, "support", GOAL, {"model": MODELS["openai"]},
                                   budget=BUDGET, queue=queue)  # fmt: skip
            client.wait(unread, 60)
        tokens, _ = wire.billed()  # one run's: by turn, both runs were given the same replies
        streamed = [r["stream"] for r in wire.received()]
    state = client.state(run_id)
    assert state.outcome is Outcome.COMPLETED, state.reason
    assert client.state(unread).outcome is Outcome.COMPLETED
    for each in (tenant, alone):
        assert client.ledger.read(each)["tokens"].committed == tokens == state.usage.tokens
    assert streamed[4:] == [True, False, False, False, False, False]  # its final, then unread
    assert not [e for e in client.events(unread, live=True, timeout_s=5) if e.live]
    said = [e for e in events if e.live]
    final = state.usage.steps
    pieces = [e for e in said if e.type == "text"]
    assert len(pieces) >= 3 and {e.data["turn"] for e in pieces} == {final}
    assert kept_text(events, final) == state.answer
    committed = next(
        i for i, e in enumerate(events) if e.type == "turn" and e.data["step"] == final
    )
    assert events.index(pieces[-1]) < committed  # the words came before their turn committed
    tools = [(e.type, e.data["tool"]) for e in said if e.type.startswith("tool_")]
    assert tools == [(kind, name) for name in ("get_order", "issue_refund", "send_status_email")
                     for kind in ("tool_started", "tool_ended")]  # fmt: skip
    # `turnstile watch --live` prints the words on a line of their own, before the turn.
    watched = CliRunner().invoke(app, ["watch", run_id, "--live"],
                                 env={"TURNSTILE_REDIS_URL": redis_url})  # fmt: skip
    assert watched.exit_code == 0, watched.output
    lines = watched.output.splitlines()
    writing = next(
        i for i, line in enumerate(lines) if line.startswith(f"  writing (turn {final})")
    )
    assert lines[writing].endswith(state.answer or "-")
    assert "t2.c1 get_order started" in watched.output


def test_an_sse_reader_that_hangs_up_mid_turn_resumes_with_nothing_lost_or_twice(
    redis_url: str,
) -> None:
    """Over the HTTP API with ?live=1: a client that hangs up after the answer's first words
    and reconnects with the last id it saw as Last-Event-ID gets the rest: what it read in the
    two connections is exactly, in order, what one reading of the whole run gives."""
    queue, tenant = f"q-{uuid.uuid4().hex[:8]}", f"t-{uuid.uuid4().hex[:8]}"
    client = client_for(redis_url)
    key = make_key(redis_url, tenant)
    with (
        wire_server("openai", "slow_answer") as wire,
        running_workers(redis_url, [queue], 1, env={**wire.env, **LEASES}),
        running_api(redis_url) as api,
        http(api, key) as web,
    ):
        run_id = client.submit(tenant, USER, "support", GOAL, {"model": MODELS["openai"]},
                               budget=BUDGET, queue=queue)  # fmt: skip
        path = f"/v1/runs/{run_id}/events?live=1"
        first = sse_events(web, path, until=lambda frame: frame[1] == "text")
        assert first[-1][1] == "text"
        rest = sse_events(web, path, last_event_id=first[-1][0])
        whole = sse_events(web, path)
    assert [f[1] for f in rest][-1] == "finished"
    assert rest[0][1] in ("text", "turn")  # the same turn goes on where it was left
    assert first + rest == whole
    assert len({f[0] for f in whole}) == len(whole)
    final = client.state(run_id)
    assert kept_text([json.loads(f[2]) for f in whole], final.usage.steps) == final.answer


@pytest.mark.slow
def test_a_worker_killed_mid_stream_leaves_its_attempt_abandoned(redis_url: str) -> None:
    """The worker is SIGKILLed while the final answer streams: a live reader sees attempt 1's
    words, then `abandoned` for attempt 1, then attempt 2's words, which alone join to the
    answer; the run has one committed turn for that step."""
    queue, tenant = f"q-{uuid.uuid4().hex[:8]}", f"t-{uuid.uuid4().hex[:8]}"
    client = client_for(redis_url)
    with wire_server("openai", "slow_answer", by_turn=True) as wire:
        env = {**wire.env, "TURNSTILE_INFLIGHT_LEASE_S": "2"}
        with running_workers(redis_url, [queue], 1, env=env) as (doomed,):
            run_id = client.submit(tenant, USER, "support", GOAL, {"model": MODELS["openai"]},
                                   budget=BUDGET, queue=queue)  # fmt: skip
            heard: list[RunEvent] = []
            reader = threading.Thread(
                target=lambda: heard.extend(client.events(run_id, live=True, timeout_s=90)),
                daemon=True,
            )
            reader.start()
            wait_until(lambda: live_texts(client, tenant, run_id), timeout_s=60,
                       what="the answer's first words")  # fmt: skip
            doomed.kill()
        with running_workers(redis_url, [queue], 1, env=env, prefix="heir"):
            wait_until(lambda: settled(client, [run_id]), timeout_s=60, what="the run to end")
            reader.join(30)
    state = client.state(run_id)
    assert state.outcome is Outcome.COMPLETED, state.reason
    final = state.usage.steps
    said = [(e.type, e.data.get("attempt")) for e in heard if e.live and e.data["turn"] == final]
    first_abandoned = said.index(("abandoned", 1))
    assert ("text", 1) in said[:first_abandoned]
    assert ("text", 2) in said[first_abandoned:]
    assert kept_text(heard, final) == state.answer
    turns = [e for e in heard if e.type == "turn" and e.data["step"] == final]
    assert len(turns) == 1


def live_texts(client: Any, tenant: str, run_id: str) -> bool:
    entries = live_store.read(client.client, tenant, run_id, Cursor(), count=500, block_ms=None)
    return any(e.live and e.type == "text" for e in entries)
