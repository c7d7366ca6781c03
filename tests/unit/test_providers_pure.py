"""The providers package's pure parts: prices and their override file, usage normalisation,
the retry policy and the turn contract's replies. The kernel's independence from it is a
contract (`kernel-pure` in pyproject.toml, shown to bite by tests/unit/test_contracts.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from turnstile import providers
from turnstile.jobs.budget import Budget
from turnstile.jobs.kernel import exposure
from turnstile.jobs.model import CONTRACT_TOKENS, ModelRequest, ModelStop, ModelTimeout, ToolSpec
from turnstile.jobs.outcomes import Outcome
from turnstile.jobs.replies import parse_reply
from turnstile.jobs.runs import new_run
from turnstile.jobs.state import Call
from turnstile.jobs.support.job import support_job
from turnstile.jobs.support.scenarios import GOAL, USER
from turnstile.jobs.support.shop import InMemoryShop
from turnstile.providers import anthropic_messages, contract, openai_chat
from turnstile.providers.config import ProviderConfig
from turnstile.providers.errors import ProviderConfigError
from turnstile.providers.prices import PRICES_FILE_ENV, Price, Tokens, cost_microusd, price_of
from turnstile.providers.retry import Failure, StreamCut, retry_after_s, with_retries
from turnstile.worker.settings import Settings

NOTHING = ProviderConfig()  # a process with nothing configured: the shipped prices


def test_cost_counts_cached_and_written_input_at_their_own_rates() -> None:
    """Plain input, cache reads, cache writes and output each at their rate, rounded up."""
    price = Price(input=3_000_000, output=15_000_000, cached_input=300_000, cache_write=3_750_000)
    tokens = Tokens(input=1_000, cached_input=600, cache_write=100, output=10)
    # 300 plain * 3 + 600 * 0.3 + 100 * 3.75 + 10 * 15 = 900 + 180 + 375 + 150 micro-dollars
    assert cost_microusd(tokens, price) == 1_605
    assert cost_microusd(Tokens(input=1), Price(input=1, output=1)) == 1  # never rounds to free


def test_the_prices_file_overrides_and_adds_models(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file named in TURNSTILE_PRICES_FILE (read into Settings, handed to the providers)
    replaces a default price and adds a new model."""
    path = tmp_path / "prices.json"
    path.write_text(
        json.dumps(
            {
                "openai:gpt-4.1-mini": {"input": 1, "output": 2},
                "openai:llama3": {"input": 5, "output": 6},
            }
        )
    )
    assert price_of("openai:llama3", NOTHING) is None
    monkeypatch.setenv(PRICES_FILE_ENV, str(path))
    config = Settings().providers
    assert config.prices_file == str(path)
    assert price_of("openai:gpt-4.1-mini", config) == Price(input=1, output=2)
    assert price_of("openai:llama3", config) == Price(input=5, output=6)
    assert price_of("anthropic:claude-haiku-4-5", config) is not None  # the defaults still apply


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("{not json", "TURNSTILE_PRICES_FILE"),
        ('{"openai:x": {"input": -1, "output": 1}}', "whole number"),
        ('{"openai:x": {"input": 1}}', "output"),
    ],
)
def test_a_bad_prices_file_is_a_clear_error(tmp_path: Path, content: str, problem: str) -> None:
    """A prices file that does not parse or holds a negative or missing price is refused."""
    path = tmp_path / "prices.json"
    path.write_text(content)
    with pytest.raises(ProviderConfigError, match=problem):
        price_of("openai:x", ProviderConfig(prices_file=str(path)))


def test_a_priced_budget_reserves_the_worst_case_at_the_models_rates() -> None:
    """Input is reserved at the dearer of plain and cache-write rates; no price reserves no cost."""
    priced = providers.budget_for({"model": "anthropic:claude-sonnet-4-6"}, Budget(), NOTHING)
    assert (priced.input_microusd_per_mtok, priced.output_microusd_per_mtok) == (
        3_750_000,
        15_000_000,
    )
    free = providers.budget_for({"model": "openai:unknown-local"}, Budget(), NOTHING)
    assert (free.input_microusd_per_mtok, free.output_microusd_per_mtok) == (0, 0)
    assert providers.budget_for({"model": "policy"}, Budget(), NOTHING) == Budget()


@pytest.mark.parametrize("spec", ["gemini:pro", "openai:", "openai: "])
def test_a_bad_model_string_is_refused(spec: str) -> None:
    """An unknown provider prefix or an empty model name is a parameter error."""
    with pytest.raises(ProviderConfigError):
        providers.parse(spec, NOTHING)


def test_retry_after_is_read_in_ms_or_seconds_and_dates_are_ignored() -> None:
    """`retry-after-ms` wins over `retry-after`; a date or an absurd wait falls back to backoff."""
    assert retry_after_s({"retry-after-ms": "250", "retry-after": "3"}) == 0.25
    assert retry_after_s({"retry-after": "2"}) == 2.0
    assert retry_after_s({"retry-after": "Wed, 21 Oct 2026 07:28:00 GMT"}) is None
    assert retry_after_s({"retry-after": "86400"}) is None


class _Clock:
    def __init__(self) -> None:
        self.t = 0.0
        self.slept: list[float] = []

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.t += seconds


def test_retries_wait_as_asked_and_stop_when_the_wait_would_pass_the_deadline() -> None:
    """A retryable failure waits as asked; a wait longer than the time left ends the run at the
    deadline with the wait in the reason; attempts run out as tool_failure."""
    clock = _Clock()
    answers = iter([Failure("retry", "rate limited", wait_s=1.0), None])

    def attempt(timeout_s: float) -> str:
        failure = next(answers)
        if failure is not None:
            raise RuntimeError("429")
        return f"ok within {timeout_s}"

    def classify(exc: Exception) -> Failure:
        return Failure("retry", "rate limited", wait_s=1.0)

    assert with_retries(attempt, classify, timeout_s=10, now=clock.now, sleep=clock.sleep) == (
        "ok within 9.0"
    )
    assert clock.slept == [1.0]

    def failing(timeout_s: float) -> str:
        raise RuntimeError("429")

    with pytest.raises(ModelStop) as stopped:
        with_retries(
            failing, lambda e: Failure("retry", "rate limited", wait_s=30.0), timeout_s=10,
            now=clock.now, sleep=clock.sleep,
        )  # fmt: skip
    assert stopped.value.outcome is Outcome.BUDGET_EXHAUSTED and "30.0 s" in stopped.value.reason
    with pytest.raises(ModelStop) as gave_up:
        with_retries(
            failing, lambda e: Failure("retry", "server error"), timeout_s=100,
            now=clock.now, sleep=clock.sleep,
        )  # fmt: skip
    assert gave_up.value.outcome is Outcome.TOOL_FAILURE
    with pytest.raises(ModelTimeout):
        with_retries(
            failing, lambda e: Failure("timeout", "timed out"), timeout_s=5,
            now=clock.now, sleep=clock.sleep,
        )  # fmt: skip


def test_function_calls_become_the_kernels_replies() -> None:
    """Plan and final functions, one call, a parallel batch with plan steps, and every
    unreadable reply map to a kernel reply or an observation naming the problem."""
    plan = contract.reply_from([("propose_plan", '{"steps": []}')], "")
    assert plan == {"type": "plan", "steps": []}
    final = contract.reply_from([("final_answer", {"outcome": "completed", "text": "done"})], "")
    assert final == {"type": "final", "outcome": "completed", "text": "done"}
    batch = contract.reply_from(
        [("get_order", '{"order_id": "a", "plan_step": "s1"}'), ("search_policy", '{"q": "x"}')],
        "",
    )
    assert parse_reply(batch, max_batch=8) is not None
    assert batch["calls"][0] == {"name": "get_order", "args": {"order_id": "a"}, "plan_step": "s1"}
    for calls, text, words in [
        ([], "", "empty"),
        ([], "Sure, I will refund it.", "no function call"),
        ([("get_order", '{"order_id": ')], "", "not valid JSON"),
        ([("get_order", "[1]")], "", "JSON object"),
        ([("final_answer", "{}"), ("get_order", "{}")], "", "only call"),
    ]:
        problem = parse_reply(contract.reply_from(calls, text), max_batch=8)
        assert isinstance(problem, str) and words in problem


def test_the_previous_batch_is_re_created_with_each_result_paired() -> None:
    """The previous turn's calls come back with their observations, by position, plan steps
    in the arguments; results that do not pair give no exchange rather than a wrong one."""
    calls = (Call(name="a", args={"x": 1}, plan_step="s1"), Call(name="b", args={}))
    results = [
        {"call": 1, "tool": "a", "status": "ok"},
        {"call": 2, "tool": "b", "status": "error", "code": "c"},
    ]
    request = ModelRequest("{}", 10, 1.0, 3, (ToolSpec("a", "", {}),), calls, results)
    past = contract.past_calls(request)
    assert [(p.id, p.name, p.arguments) for p in past] == [
        ("call_t2_1", "a", {"x": 1, "plan_step": "s1"}),
        ("call_t2_2", "b", {}),
    ]
    assert [p.failed for p in past] == [False, True]
    assert contract.past_calls(ModelRequest("{}", 10, 1.0, 3, (), calls, {"status": "ok"})) == []


def test_a_provider_runs_reservation_counts_what_its_request_carries_besides_the_view() -> None:
    """For a provider model the turn's reservation adds the tool definitions, the previous
    exchange and the contract's text to the view; a stand-in model's does not change."""
    job = support_job(InMemoryShop())

    def reserved_tokens(model: str) -> int:
        state = new_run(
            run_id="r1", tenant="t", user_id=USER, job=job, goal=GOAL, params={"model": model}
        )
        state.last_result = {"status": "ok", "text": "x" * 400}
        return exposure(state, job)[1].tokens

    extra = reserved_tokens("openai:gpt-4.1-mini") - reserved_tokens("policy")
    assert extra > CONTRACT_TOKENS + 100 + 400 // 4


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_a_reply_is_read_into_the_fields_used_and_a_body_that_is_not_one_is_retried(
    provider: str,
) -> None:
    """Each adapter reads a 200's body (the recorded exchanges' first) into the fields it uses,
    as the SDK's model did; a body that is not JSON, or not the format's shape, is a reply cut
    in transit: `classify` retries it."""
    module = openai_chat if provider == "openai" else anthropic_messages
    fixture = Path(__file__).parents[1] / "wire" / "fixtures" / provider / "support_run.json"
    body = json.loads(fixture.read_text())[0]["body"]
    reply = module.decoded(json.dumps(body).encode())
    tokens = module.usage_of(reply)
    assert tokens is not None and tokens.output > 0 and tokens.input > 0
    assert reply.model == body["model"]
    for bad in (b"<html>busy</html>", b'{"choices": "none", "content": 1}', b"[]"):
        with pytest.raises(StreamCut) as cut:
            module.decoded(bad)
        failure = module.classify(cut.value)
        assert failure is not None and failure.kind == "retry"
