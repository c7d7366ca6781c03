"""The OpenAI and Anthropic adapters against a real HTTP server process that speaks each
provider's wire format, answering from recorded exchanges: kernel turns in this process, with a
real tenant ledger on a real server. In every scenario the ledger's committed tokens and cost
are the provider-reported usage at the price table's rates, and the run replays from its
model spans to the identical state with no network."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest

from tests.wire.wire import MODELS, Wire, wire_server
from turnstile.jobs.budget import Budget
from turnstile.jobs.clock import ActiveClock, SimClock
from turnstile.jobs.kernel import Continue, Finished, Move, Runtime, exposure, turn
from turnstile.jobs.live import NO_LIVE, LiveSink
from turnstile.jobs.model import Replay, responses_from_spans
from turnstile.jobs.outcomes import Outcome
from turnstile.jobs.runs import new_run
from turnstile.jobs.state import RunState
from turnstile.jobs.support.job import support_job
from turnstile.jobs.support.scenarios import GOAL, USER
from turnstile.jobs.support.shop import InMemoryShop
from turnstile.jobs.support.tools import REFUND_DIMENSION
from turnstile.jobs.trace import Trace
from turnstile.ledger.client import Ledger
from turnstile.ledger.inputs import DEFAULT_DIMENSIONS
from turnstile.providers import budget_for
from turnstile.providers.config import ProviderConfig
from turnstile.providers.runs import model_for_run
from turnstile.worker.scheduling.limits import ledger_amounts

pytestmark = pytest.mark.integration

BOTH = ["openai", "anthropic"]
EMAIL_COST_MICROUSD = 50  # send_status_email's declared cost bound, charged for each email
BUDGET = Budget(max_tokens=40_000, max_steps=8, max_tool_calls=8, deadline_ms=30_000)


@pytest.fixture
def ledger(redis_url: str) -> Iterator[Ledger]:
    dimensions = (*DEFAULT_DIMENSIONS, REFUND_DIMENSION)  # the support job charges refunds
    with Ledger.from_url(redis_url, dimensions=dimensions) as it:
        yield it


class Run:
    """One run of the support job on a provider model, turn by turn as the worker takes them:
    reserve the turn's exposure, run it, settle what it used. The provider's URL and key are
    those of `providers`, as a worker's Settings would hand them over."""

    def __init__(
        self, ledger: Ledger, unique: str, provider: str, providers: ProviderConfig,
        live: LiveSink = NO_LIVE, **budget: Any,
    ) -> None:  # fmt: skip
        self.ledger, self.tenant = ledger, f"t-{unique}"
        self.shop = InMemoryShop()
        self.job = support_job(self.shop)
        params = {"model": MODELS[provider]}
        chosen = budget_for(params, msgspec.structs.replace(BUDGET, **budget), providers)
        self.state: RunState = new_run(
            run_id=f"run-{unique}", tenant=self.tenant, user_id=USER, job=self.job, goal=GOAL,
            params=params, budget=chosen,
        )  # fmt: skip
        self.initial = self.state.copy()
        self.turns = 0
        ledger.set_ceiling(self.tenant, "cost_microusd", 10_000_000)
        clock = ActiveClock()
        self.runtime = Runtime(
            job=self.job,
            model=model_for_run(self.job, params, providers),
            clock=clock,
            trace=Trace(clock),
            live=live,
        )

    def turn(self) -> Move:
        _, worst = exposure(self.state, self.job)
        hold = f"{self.state.run_id}:{self.state.usage.steps + 1}"
        assert self.ledger.reserve(self.tenant, hold, ledger_amounts(worst), timeout_s=60).admitted
        before = msgspec.structs.replace(self.state.usage)
        move = turn(self.state, self.runtime)
        self.turns += 1
        self.ledger.settle(self.tenant, hold, ledger_amounts(self.state.usage - before))
        return move

    def until_done(self, max_turns: int = 10) -> Move:
        move: Move = Continue()
        for _ in range(max_turns):
            move = self.turn()
            if not isinstance(move, Continue):
                break
        return move

    def committed(self) -> tuple[int, int]:
        dims = self.ledger.read(self.tenant)
        return dims["tokens"].committed, dims["cost_microusd"].committed

    def replayed(self) -> RunState:
        """The run again from its initial state on a simulated clock, the model replaced by
        the replies, failures and usage recorded in its model spans: no network."""
        state, clock = self.initial.copy(), SimClock()
        job = support_job(InMemoryShop())
        model = Replay(responses_from_spans(self.runtime.trace.spans))
        runtime = Runtime(job=job, model=model, clock=clock, trace=Trace(clock))
        try:
            for _ in range(self.turns):
                turn(state, runtime)
        finally:
            runtime.close()
        return state

    def close(self) -> None:
        self.runtime.close()
        assert self.replayed().to_json() == self.state.to_json(), "replay parted from the run"


@pytest.fixture
def run_on(ledger: Ledger, unique: str) -> Iterator[Any]:
    made: list[Run] = []

    def start(wire: Wire, live: LiveSink = NO_LIVE, **budget: Any) -> Run:
        config = ProviderConfig(environ=wire.env)  # the SDK's variables, pointing at the wire
        made.append(Run(ledger, f"{unique}-{len(made)}", wire.provider, config, live, **budget))
        return made[-1]

    yield start
    for run in made:
        run.close()


def _messages(request: dict[str, Any]) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = request["body"]["messages"]
    return messages


@pytest.mark.parametrize("provider", BOTH)
def test_a_support_run_completes_with_the_refund_and_the_email(provider: str, run_on: Any) -> None:
    """Plan, three tool calls and a final answer over native tool calling complete the run,
    refund and email once, and the ledger holds exactly what the provider reported."""
    with wire_server(provider, "support_run") as wire:
        run = run_on(wire)
        move = run.until_done()
        received = wire.received()
        assert isinstance(move, Finished) and move.outcome is Outcome.COMPLETED, (
            run.state.reason,
            run.state.last_result,
        )
        tokens, cost = wire.billed()
        assert run.committed() == (tokens, cost + EMAIL_COST_MICROUSD)
        assert run.committed() == (run.state.usage.tokens, run.state.usage.cost_microusd)
    assert run.shop.effects(run.state.tenant, run.state.run_id) == [
        ["refund", "ord_1001", 3000],
        ["email", "ord_1001"],
    ]
    assert len(received) == 5
    names = {(t.get("function") or t)["name"] for t in received[0]["body"]["tools"]}
    assert {"get_order", "issue_refund", "propose_plan", "final_answer"} <= names
    # input stays flat: every request is the view plus at most the last exchange
    assert all(len(_messages(r)) <= 4 for r in received)


@pytest.mark.parametrize("provider", BOTH)
def test_parallel_tool_calls_are_one_batch_and_come_back_as_paired_results(
    provider: str, run_on: Any
) -> None:
    """Two tool calls in one reply run as one batch of reads; the next request re-creates that
    exchange, each call paired with its own result by id, after the view."""
    with wire_server(provider, "parallel_reads") as wire:
        run = run_on(wire)
        assert isinstance(run.turn(), Continue)
        assert [r["tool"] for r in run.state.last_result] == ["get_order", "search_policy"]
        assert all(r["status"] == "ok" for r in run.state.last_result)
        move = run.turn()
        second = [m for m in _messages(wire.received()[1]) if m["role"] != "system"]
        tokens, cost = wire.billed()
        assert run.committed() == (tokens, cost + 200)  # search_policy's declared cost bound
    assert isinstance(move, Finished) and move.outcome is Outcome.ESCALATED
    assert second[0]["role"] == "user" and json.loads(second[0]["content"])["goal"] == GOAL
    if provider == "openai":
        assistant, results = second[1], second[2:]
        ids = [c["id"] for c in assistant["tool_calls"]]
        assert [c["function"]["name"] for c in assistant["tool_calls"]] == [
            "get_order",
            "search_policy",
        ]
        assert [m["tool_call_id"] for m in results] == ids
        contents = [json.loads(m["content"]) for m in results]
    else:
        assistant, results = second[1], second[2]["content"]
        ids = [b["id"] for b in assistant["content"]]
        assert [b["name"] for b in assistant["content"]] == ["get_order", "search_policy"]
        assert [b["tool_use_id"] for b in results] == ids
        contents = [json.loads(b["content"]) for b in results]
    assert contents[0]["order_status"] and "text" in contents[1]


RETRIED = {
    "openai": ["rate_limited", "server_error", "cut_reply"],
    "anthropic": ["rate_limited", "overloaded", "cut_reply"],
}


@pytest.mark.parametrize(
    ("provider", "scenario"), [(p, s) for p, scenarios in RETRIED.items() for s in scenarios]
)
def test_a_rate_limit_a_server_error_or_a_cut_reply_is_retried_within_the_deadline(
    provider: str, scenario: str, run_on: Any
) -> None:
    """A 429 is retried after the `retry-after` it names, a 5xx, a 529 or a reply cut in transit
    after a backoff; the wait is active time counted against the deadline, and only the answer
    that arrived is charged."""
    with wire_server(provider, scenario) as wire:
        run = run_on(wire)
        assert isinstance(run.turn(), Continue)
        first, second = wire.received()
        assert run.committed() == wire.billed()
    waited_s = second["t"] - first["t"]
    assert waited_s >= (1.0 if scenario == "rate_limited" else 0.5)
    assert run.state.usage.elapsed_ms >= waited_s * 1000 - 50
    assert [s.id for s in run.state.plan] == ["s1", "s2", "s3"]


@pytest.mark.parametrize("provider", BOTH)
def test_a_provider_that_hangs_ends_the_run_at_its_deadline(provider: str, run_on: Any) -> None:
    """The call's timeout is the run's remaining time: a provider that never answers ends the
    run budget_exhausted(deadline), and the tenant is charged no tokens."""
    with wire_server(provider, "hang") as wire:
        run = run_on(wire, deadline_ms=1_500)
        move = run.turn()
        assert len(wire.received()) == 1
    assert isinstance(move, Finished) and move.outcome is Outcome.BUDGET_EXHAUSTED
    assert move.detail == "deadline"
    assert run.committed() == (0, 0)
    assert run.state.usage.elapsed_ms == 1_500


@pytest.mark.parametrize("provider", BOTH)
def test_malformed_arguments_and_unknown_tools_are_observations(provider: str, run_on: Any) -> None:
    """Arguments that are not JSON or fail the schema, and a tool that does not exist, come back
    to the model as observations naming the problem; the reply is still charged."""
    codes = []
    for scenario in ("bad_arguments", "unknown_tool"):
        with wire_server(provider, scenario) as wire:
            run = run_on(wire)
            assert isinstance(run.turn(), Continue)
            assert run.committed() == wire.billed()
        codes.append(run.state.last_result["code"])
        if provider == "openai" and scenario == "bad_arguments":
            assert "not valid JSON" in run.state.last_result["detail"]
    expected = "invalid_reply" if provider == "openai" else "invalid_arguments"
    assert codes == [expected, "unknown_tool"]


STOPS = [
    ("openai", "refusal", Outcome.GUARDRAIL_STOP, "provider.refusal"),
    ("anthropic", "refusal", Outcome.GUARDRAIL_STOP, "provider.refusal"),
    ("openai", "context_length", Outcome.ERROR, "provider.context_length"),
    ("anthropic", "context_length", Outcome.ERROR, "provider.context_length"),
    ("openai", "bad_key", Outcome.ERROR, "provider.authentication"),
    ("anthropic", "bad_key", Outcome.ERROR, "provider.authentication"),
    ("openai", "no_quota", Outcome.ERROR, "provider.quota"),
]


@pytest.mark.parametrize(("provider", "scenario", "outcome", "detail"), STOPS)
def test_a_refusal_or_a_request_that_cannot_succeed_ends_the_run_with_a_reason(
    provider: str, scenario: str, outcome: Outcome, detail: str, run_on: Any
) -> None:
    """A refusal ends the run guardrail_stop; a context-length error, a rejected key or an
    exhausted quota end it error, after one attempt, with the provider's words in the reason;
    the tenant is charged what the provider billed (a refusal's tokens, an error's nothing)."""
    with wire_server(provider, scenario) as wire:
        run = run_on(wire)
        move = run.turn()
        assert len(wire.received()) == 1
        assert run.committed() == wire.billed()
    assert isinstance(move, Finished) and (move.outcome, move.detail) == (outcome, detail)
    assert move.reason and "\n" not in move.reason
    if scenario == "refusal":
        assert run.committed()[0] > 0


def test_a_missing_key_ends_the_run_without_a_call(
    run_on: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no API key the run ends error with the variable to set, and nothing is charged."""
    with wire_server("openai", "support_run") as wire:
        monkeypatch.setattr(Wire, "env", property(lambda w: {"OPENAI_BASE_URL": "http://x/v1"}))
        run = run_on(wire)
        move = run.turn()
        assert wire.received() == []
    assert isinstance(move, Finished) and move.outcome is Outcome.ERROR
    assert "OPENAI_API_KEY" in move.reason
    assert run.committed() == (0, 0)


def test_a_base_url_refusing_connections_ends_the_run_tool_failure(
    run_on: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A provider that refuses every connection is retried with backoff, then the run ends
    tool_failure naming it, with nothing charged."""
    with wire_server("openai", "support_run") as wire:
        closed = wire.port
    monkeypatch.setattr(
        Wire,
        "env",
        property(
            lambda w: {"OPENAI_BASE_URL": f"http://127.0.0.1:{closed}/v1", "OPENAI_API_KEY": "k"}
        ),
    )
    run = run_on(wire)
    move = run.turn()
    assert isinstance(move, Finished) and move.outcome is Outcome.TOOL_FAILURE
    assert "unreachable" in move.reason and "4 attempts" in move.reason
    assert run.committed() == (0, 0)
