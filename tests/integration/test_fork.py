"""Forking a run from a recorded turn: a support run recorded on the stand-in model is forked
after its third turn onto a provider's model (the fake OpenAI server), completes there with its
own id and ledger charges, and `trace` shows where it came from. Every bad input is one line
and starts nothing."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator

import pytest
from typer.testing import CliRunner

from tests.integration.apiserver import http, make_key, running_api
from tests.integration.workers import client_for, running_workers, settled, wait_until
from tests.wire.agent import USAGE
from tests.wire.wire import MODELS, Wire, wire_server
from turnstile.errors import RunNotFoundError
from turnstile.jobs.outcomes import Outcome
from turnstile.jobs.support.scenarios import GOAL, USER
from turnstile.worker.cli.main import app
from turnstile.worker.client._client import Client
from turnstile.worker.http.apikeys import Role
from turnstile.worker.ops.errors import ForkRefusedError
from turnstile.worker.ops.evaluate import report
from turnstile.worker.ops.fork import Variant, fork_run
from turnstile.worker.ops.replay import replay_run
from turnstile.worker.store import keys

pytestmark = pytest.mark.integration

runner = CliRunner()
EMAIL_ARGS = {"send_status_email": {"order_id": "ord_1001"}}
AGENT = {"agent": {"calls": ["get_order", "issue_refund", "send_status_email"], "args": EMAIL_ARGS}}


@pytest.fixture(scope="module")
def wire() -> Iterator[Wire]:
    with wire_server("openai", script=AGENT) as served:
        yield served


@pytest.fixture(scope="module")
def queue(redis_url: str, wire: Wire) -> Iterator[str]:
    """A queue of this module's, served by one worker that reaches the fake OpenAI server."""
    name = f"fork-{uuid.uuid4().hex[:8]}"
    with running_workers(redis_url, [name], 1, env=wire.env):
        yield name


def _recorded(client: Client, tenant: str, queue: str) -> str:
    run_id = client.submit(tenant, USER, "support", GOAL, {"model_latency_s": 0}, queue=queue)
    wait_until(lambda: settled(client, [run_id]), timeout_s=60, what="the original to end")
    assert client.state(run_id).outcome is Outcome.COMPLETED
    return run_id


def test_a_fork_from_turn_3_completes_on_another_model_and_trace_shows_its_origin(
    redis_url: str, wire: Wire, queue: str
) -> None:
    """The original: five turns on the stand-in (plan, read, refund, email, answer). The fork
    after turn 3 starts with the refund done and the email to send, runs turns 4 and 5 on
    openai:gpt-4.1-mini (two requests to the fake server) and completes; its ledger charge is
    the provider's two replies; `trace` says `forked from <run> at turn 3`."""
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    client = client_for(redis_url)
    origin = _recorded(client, tenant, queue)
    before = client.ledger.read(tenant)["tokens"].committed
    asked = len(wire.received())
    said = runner.invoke(app, [
        "fork", origin, "--at", "3", "--param", f"model={MODELS['openai']}",
        "--queue", queue, "--redis-url", redis_url,
    ])  # fmt: skip
    assert said.exit_code == 0, said.output
    fork = said.output.strip()
    wait_until(lambda: settled(client, [fork]), timeout_s=60, what="the fork to end")
    assert len(wire.received()) - asked == 2
    tokens = 2 * (USAGE["input"] + USAGE["output"])  # each of the agent's replies
    state = client.state(fork)
    assert fork != origin
    assert state.outcome is Outcome.COMPLETED, state.reason
    assert state.params["model"] == MODELS["openai"]
    assert state.usage.steps == 5  # turns 1-3 inherited, 4 and 5 its own
    assert state.origin is not None and (state.origin.run_id, state.origin.turn) == (origin, 3)
    assert client.ledger.read(tenant)["tokens"].committed - before == tokens
    submitted = next(e for _, e in client.store.events(tenant, fork))
    assert (submitted["forked_from"], submitted["at_turn"]) == (origin, 3)
    trace = runner.invoke(app, ["trace", fork, "--redis-url", redis_url])
    assert trace.exit_code == 0, trace.output
    assert trace.output.splitlines()[0] == f"forked from {origin} at turn 3"
    assert "t4.c1 tool send_status_email ok" in trace.output
    status = runner.invoke(app, ["status", fork, "--redis-url", redis_url])
    assert re.search(rf"forked from\W+{origin} at turn 3", status.output), status.output
    replayed = replay_run(client, fork)  # from the state it was forked with, the server gone
    assert replayed.matches, (replayed.difference, replayed.notes)
    assert replayed.turns == 2


def test_a_fork_refuses_bad_input_in_one_line_and_starts_nothing(
    redis_url: str, queue: str
) -> None:
    """A turn outside the run, a run still in flight, a recording removed by retention, a
    variant that cannot be built (an unknown model, an unknown param): one line each, and the
    tenant has no run more than before."""
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    client = client_for(redis_url)
    origin = _recorded(client, tenant, queue)
    gone = _recorded(client, tenant, queue)
    waiting = client.submit(tenant, USER, "support", GOAL, queue=f"{queue}-idle")  # no worker
    client.client.delete(keys.events(tenant, gone))  # what retention leaves of a recording
    runs_before = client.client.zcard(keys.runs(tenant))
    refused = {
        "outside": (dict(run_id=origin, at=5), "turn 5 is outside run .* which has 5 turn"),
        "negative": (dict(run_id=origin, at=-1), "turn -1 is outside run"),
        "in flight": (dict(run_id=waiting, at=0), "still in flight"),
        "retention": (dict(run_id=gone, at=1), "recording was removed"),
        "model": (
            dict(run_id=origin, at=1, variant=Variant(params={"model": "gemini:pro"})),
            "the variant cannot be built: .*unknown provider 'gemini'",
        ),
        "param": (
            dict(run_id=origin, at=1, variant=Variant(params={"colour": "red"})),
            "the variant cannot be built: params.colour: unknown key",
        ),
    }
    for name, (kwargs, message) in refused.items():
        with pytest.raises(ForkRefusedError, match=message) as caught:
            fork_run(client, **kwargs, queue=queue)  # type: ignore[arg-type]
        assert "\n" not in str(caught.value), name
    with pytest.raises(RunNotFoundError):
        fork_run(client, "run_never_was", at=0)
    assert client.client.zcard(keys.runs(tenant)) == runs_before
    said = runner.invoke(app, ["fork", origin, "--at", "9", "--redis-url", redis_url])
    assert said.exit_code == 1
    assert said.output.strip().splitlines() == [
        f"error: turn 9 is outside run {origin}, which has 5 turn(s): fork at 0 (its start) to 4"
    ]


def test_fork_and_evaluation_over_http_keep_to_their_tenants(redis_url: str, queue: str) -> None:
    """`POST /v1/runs/{id}/fork`: 202 with the new run's id and its origin; a turn outside the
    run is a 422 `fork_refused` problem; another tenant's key does not find the run (404).
    `POST /v1/evals` needs an operator key (a service key: 403); `GET /v1/evals/{id}` gives the
    report to an operator and to the evaluation's tenant, not to another tenant (404), and an
    unknown id is a 404 `evaluation_not_found`."""
    tenant, judge = (f"{p}-{uuid.uuid4().hex[:8]}" for p in ("t", "ev"))
    client = client_for(redis_url)
    body = {"tenant": tenant, "eval_tenant": judge, "params": {"amount_cents": 5000},
            "queue": queue}  # fmt: skip
    with running_api(redis_url) as api:
        origin = _recorded(client, tenant, queue)
        with http(api, make_key(redis_url, tenant)) as web:
            refused = web.post(f"/v1/runs/{origin}/fork", json={"at": 7})
            assert refused.status_code == 422, refused.text
            assert refused.json()["code"] == "fork_refused"
            made = web.post(f"/v1/runs/{origin}/fork", json={"at": 2, "queue": queue})
            assert made.status_code == 202, made.text
            fork = made.json()["run_id"]
            assert (made.json()["forked_from"], made.json()["at_turn"]) == (origin, 2)
            assert web.post("/v1/evals", json=body).status_code == 403
        with http(api, make_key(redis_url, f"other-{tenant}")) as other:
            assert other.post(f"/v1/runs/{origin}/fork", json={"at": 1}).status_code == 404
        wait_until(lambda: settled(client, [fork]), timeout_s=60, what="the fork to end")
        with http(api, make_key(redis_url, tenant, Role.OPERATOR)) as operator:
            started = operator.post("/v1/evals", json=body)
            assert started.status_code == 202, started.text
            eval_id = started.json()["eval_id"]
            wait_until(lambda: report(client, eval_id)["status"] == "done", timeout_s=60,
                       what="the evaluation to end")  # fmt: skip
            said = operator.get(f"/v1/evals/{eval_id}").json()
            missing = operator.get("/v1/evals/ev_never")
            assert (missing.status_code, missing.json()["code"]) == (404, "evaluation_not_found")
        with http(api, make_key(redis_url, judge)) as theirs:
            assert theirs.get(f"/v1/evals/{eval_id}").json()["totals"] == said["totals"]
        with http(api, make_key(redis_url, f"other-{tenant}")) as other:
            assert other.get(f"/v1/evals/{eval_id}").status_code == 404
    assert client.state(fork).outcome is Outcome.COMPLETED
    # the fork (from turn 2) and the original are both recorded runs: both evaluated, each
    # with its refund held
    assert (said["totals"]["evaluated"], said["totals"]["held_writes"]) == (2, 2)
