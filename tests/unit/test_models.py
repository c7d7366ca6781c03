"""Models for every job, in process: model strings and named endpoints, what a job may name as
its model, the run parameters that override it, building a run's model, the fallback, and the
wire server's agent that answers for any job."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.model_jobs import DESK_TOOLS, desk
from tests.wire.agent import FINAL, OPENAI_PATH, PLAN, Agent, made_up
from turnstile import Budget, Job, ModelStop, ModelUnavailable, ParamsError, Scripted
from turnstile.jobs.errors import JobDefinitionError
from turnstile.jobs.model import ModelRequest, ModelResponse
from turnstile.jobs.outcomes import Outcome
from turnstile.models import (
    ENDPOINTS_ENV,
    Fallback,
    ProviderConfigError,
    check,
    endpoints,
    make,
    model_for_run,
    model_price,
    parse,
)
from turnstile.providers import budget_for, unpriced
from turnstile.providers.anthropic_messages import AnthropicMessages
from turnstile.providers.openai_chat import OpenAIChat
from turnstile.worker.registry import Registry
from turnstile.worker.settings import Settings

TWO = {
    "local": {"base_url": "http://127.0.0.1:9/v1", "key_env": None,
              "prices": {"llama3.1:8b": {"input": 0, "output": 0}}},
    "proxy": {"base_url": "http://127.0.0.1:9", "format": "anthropic", "key_env": "PROXY_KEY"},
}  # fmt: skip


@pytest.fixture
def two(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENDPOINTS_ENV, json.dumps(TWO))
    monkeypatch.delenv("PROXY_KEY", raising=False)


def _one_line(exc: pytest.ExceptionInfo[BaseException]) -> str:
    text = str(exc.value)
    assert text and "\n" not in text
    return text


def test_named_endpoints_are_model_providers_beside_the_built_ins(two: None) -> None:
    """`name:model` is routed to its endpoint with its format, URL and prices; a model name may
    hold a colon itself; the built-ins keep working."""
    assert parse("local:llama3.1:8b") == ("local", "llama3.1:8b")
    assert parse("openai:gpt-4.1-mini") == ("openai", "gpt-4.1-mini")
    local, proxy = make("local:llama3.1:8b"), make("proxy:claude-x")
    assert isinstance(local, OpenAIChat) and local.route.url == "http://127.0.0.1:9/v1"
    assert isinstance(proxy, AnthropicMessages) and proxy.route.key_env == "PROXY_KEY"
    assert local.spec == "local:llama3.1:8b" and local.price is not None
    assert model_price("local:llama3.1:8b") is not None
    assert model_price("openai:gpt-4.1-mini") is not None  # the shipped table
    assert model_price("local:other") is None
    assert sorted(endpoints()) == ["local", "proxy"]


def test_an_unknown_endpoint_or_an_unset_key_is_one_line(
    two: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unknown provider names the ones there are and the variable; an endpoint whose key
    variable is not set is refused by `check`, one without a key variable is not."""
    with pytest.raises(ProviderConfigError) as unknown:
        check("vllm:llama")
    assert "unknown provider 'vllm'" in _one_line(unknown)
    assert "openai, anthropic, local, proxy" in str(unknown.value)
    assert ENDPOINTS_ENV in str(unknown.value)
    with pytest.raises(ProviderConfigError) as keyless:
        check("proxy:claude-x")
    assert "PROXY_KEY, which is not set" in _one_line(keyless)
    assert check("local:llama3.1:8b") == "local:llama3.1:8b"
    monkeypatch.setenv("PROXY_KEY", "k")
    assert check("proxy:claude-x") == "proxy:claude-x"


@pytest.mark.parametrize(
    ("config", "words"),
    [
        ("{not json", "TURNSTILE_MODEL_ENDPOINTS"),
        ('{"openai": {"base_url": "http://x"}}', "openai is built in"),
        ('{"Bad Name": {"base_url": "http://x"}}', "endpoint name"),
        ('{"x": {"base_url": "ftp://x"}}', "base_url must be an http(s) URL"),
        ('{"x": {"base_url": "http://x", "format": "gemini"}}', "format"),
        ('{"x": {"base_url": "http://x", "key_env": "not a name"}}', "key_env"),
        ('{"x": {"base_url": "http://x", "prices": {"m": {"input": -1, "output": 0}}}}', "x:m"),
        ('{"x": {"base_url": "http://x", "colour": "red"}}', "colour"),
        ("/nonexistent/endpoints.json", "No such file"),
    ],
)
def test_a_bad_endpoint_configuration_is_one_line_naming_the_problem(
    config: str, words: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each configuration that cannot be used is a ProviderConfigError of one line."""
    monkeypatch.setenv(ENDPOINTS_ENV, config)
    with pytest.raises(ProviderConfigError) as refused:
        parse("x:m")
    assert words in _one_line(refused)


def test_endpoints_may_come_from_a_file_read_again_when_it_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TURNSTILE_MODEL_ENDPOINTS may name a JSON file; an edited file is read again."""
    path = tmp_path / "endpoints.json"
    path.write_text(json.dumps({"one": {"base_url": "http://127.0.0.1:9/v1"}}))
    monkeypatch.setenv(ENDPOINTS_ENV, str(path))
    assert parse("one:m") == ("one", "m")
    path.write_text(json.dumps({"two": {"base_url": "http://127.0.0.1:9/v1"}}))
    with pytest.raises(ProviderConfigError, match="unknown provider 'one'"):
        parse("one:m")
    assert parse("two:m") == ("two", "m")


def _tools() -> dict[str, Any]:
    return dict(DESK_TOOLS)


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"model": "gpt-4.1-mini"}, "is not a model string provider:model"),
        ({"model": 42}, "model must be a model string"),
        ({"model": "openai:gpt-4.1-mini", "fallback_model": "nope"}, "fallback_model 'nope'"),
    ],
)
def test_a_job_naming_a_model_wrongly_is_a_definition_error(
    fields: dict[str, Any], words: str
) -> None:
    """A job's model is a model string, a Model or a factory; its fallback a model string."""
    with pytest.raises(JobDefinitionError) as refused:
        Job(name="bad", tools=_tools(), **fields)
    assert words in _one_line(refused)


def test_every_job_takes_the_model_and_fallback_params_in_form_only() -> None:
    """`model` and `fallback_model` pass any job's schema when they are model strings; anything
    else is refused naming the key. Whether the provider exists is asked at submit."""
    job = desk()
    job.validate_params({"model": "anthropic:claude-sonnet-4-6", "fallback_model": "x:y"})
    for params, key in (
        ({"model": "fast"}, "params.model"),
        ({"fallback_model": 3}, "params.fallback_model"),
    ):
        with pytest.raises(ParamsError) as refused:
            job.validate_params(params)
        assert _one_line(refused).startswith(key)
    with pytest.raises(ParamsError, match="unknown key"):
        job.validate_params({"modle": "openai:gpt-4.1-mini"})


def test_the_registry_lists_a_jobs_default_models(monkeypatch: pytest.MonkeyPatch) -> None:
    """`turnstile jobs --json` shows the model string a job runs on by default, and none for
    a job that builds its own."""
    monkeypatch.setenv("TURNSTILE_JOBS", "tests.model_jobs:desk,tests.model_jobs:raising_model")
    rows = {r["name"]: r for r in Registry.from_settings(Settings()).describe()}
    assert rows["desk"]["model"] == "openai:gpt-4.1-mini" and rows["desk"]["fallback_model"] is None
    assert rows["raising_model"]["model"] is None


def test_the_run_model_is_the_params_then_the_jobs_own() -> None:
    """A run's `model` string overrides the job's string, Model or factory; a factory returning
    something that is not a Model is a TypeError saying so."""
    job = desk()
    assert job.model_spec({}) == "openai:gpt-4.1-mini"
    assert job.model_spec({"model": "anthropic:claude-sonnet-4-6"}) == "anthropic:claude-sonnet-4-6"
    built = model_for_run(job, {"model": "anthropic:claude-sonnet-4-6"})
    assert isinstance(built, AnthropicMessages) and built.model == "claude-sonnet-4-6"
    scripted = Scripted(lambda view, i: {"type": "final", "outcome": "completed", "text": ""})
    fixed = Job(name="fixed", tools=_tools(), model=scripted)
    assert model_for_run(fixed, {}) is scripted
    assert isinstance(model_for_run(fixed, {"model": "openai:gpt-4.1-mini"}), OpenAIChat)
    text: Any = lambda params: "a string"  # noqa: E731 - typed Any: it is the mistake under test
    bad = Job(name="bad", tools=_tools(), model=text)
    with pytest.raises(TypeError, match="returned str, not a Model"):
        model_for_run(bad, {})


class _Down:
    def __init__(self, error: ModelStop) -> None:
        self.error, self.asked = error, 0

    def next(self, request: ModelRequest) -> ModelResponse:
        self.asked += 1
        raise self.error


class _Answers:
    def __init__(self) -> None:
        self.timeouts: list[float] = []

    def next(self, request: ModelRequest) -> ModelResponse:
        self.timeouts.append(request.timeout_s)
        return ModelResponse({"type": "final"}, answered_by="local:llama3")


def _request(timeout_s: float = 10.0) -> ModelRequest:
    return ModelRequest("{}", 100, timeout_s, 1)


def test_a_fallback_answers_only_when_the_first_model_is_unavailable() -> None:
    """A first model that gave up on retries lets the fallback answer within the time left,
    and the response says which model answered and why; any other stop ends as it was."""
    clock = iter([0.0, 4.0])
    unavailable = ModelUnavailable(Outcome.TOOL_FAILURE, "openai failed (503)", "model")
    second = _Answers()
    fallback = Fallback(
        _Down(unavailable), second, first_spec="openai:gpt-4.1-mini", second_spec="local:x",
        now=lambda: next(clock),
    )  # fmt: skip
    response = fallback.next(_request())
    assert response.answered_by == "local:llama3"
    assert response.fallback == "openai:gpt-4.1-mini: openai failed (503)"
    assert second.timeouts == [6.0]
    refused = ModelStop(Outcome.ERROR, "openai refused the key", "provider.authentication")
    stops = Fallback(_Down(refused), _Answers(), first_spec="a:b", second_spec="c:d")
    with pytest.raises(ModelStop) as stopped:
        stops.next(_request())
    assert stopped.value is refused


def test_a_run_or_a_job_names_a_fallback_and_it_is_priced_dearer(
    two: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`fallback_model` (the run's, else the job's) wraps the run's model; the run's budget
    reserves at the dearer of the two prices; an unpriced fallback is named by `unpriced`."""
    job = Job(name="fb", tools=_tools(), model="local:llama3.1:8b",
              fallback_model="openai:gpt-4.1-mini")  # fmt: skip
    built = model_for_run(job, {})
    assert isinstance(built, Fallback) and built.second_spec == "openai:gpt-4.1-mini"
    assert model_for_run(job, {"fallback_model": "local:other"}).second_spec == "local:other"  # type: ignore[attr-defined]
    config = Settings().providers  # TURNSTILE_MODEL_ENDPOINTS, as a worker or a client reads it
    chosen = budget_for({}, Budget(), config, job=job)
    assert chosen.output_microusd_per_mtok == 1_600_000  # gpt-4.1-mini's, not the free local's
    assert unpriced({}, config, job) is None
    assert unpriced({"fallback_model": "local:other"}, config, job) == "local:other"
    with pytest.raises(ProviderConfigError, match="PROXY_KEY"):
        budget_for({"fallback_model": "proxy:claude-x"}, Budget(), config, job=job)


def test_the_agent_plans_calls_each_tool_once_and_answers() -> None:
    """From the request alone: a plan over the planned tools, then each tool after the one the
    previous turn called, with made-up arguments and its plan step, then the final answer."""
    tools = [{"type": "function", "function": {"name": t.name, "parameters": dict(t.schema)}}
             for t in DESK_TOOLS.values()]  # fmt: skip
    agent = Agent(off_plan=["ticket_history"])

    def body(plan: list[Any], previous: str | None) -> dict[str, Any]:
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": ""},
            {"role": "user", "content": json.dumps({"plan": plan})},
        ]
        if previous:
            call = {"function": {"name": previous, "arguments": "{}"}}
            messages.append({"role": "assistant", "tool_calls": [call]})
        return {"tools": tools, "messages": messages}

    name, args = agent.decide(OPENAI_PATH, body([], None))
    assert name == PLAN
    assert args["steps"] == [
        {"id": "s1", "tool": "find_ticket", "depends_on": []},
        {"id": "s2", "tool": "close_ticket", "depends_on": ["s1"]},
    ]
    plan = args["steps"]
    assert agent.decide(OPENAI_PATH, body(plan, None)) == (
        "find_ticket", {"ticket": "x", "plan_step": "s1"}
    )  # fmt: skip
    assert agent.decide(OPENAI_PATH, body(plan, "find_ticket")) == (
        "ticket_history", {"ticket": "x"}
    )  # fmt: skip
    assert agent.decide(OPENAI_PATH, body(plan, "ticket_history"))[0] == "close_ticket"
    assert agent.decide(OPENAI_PATH, body(plan, "close_ticket"))[0] == FINAL
    assert made_up({"type": "integer", "minimum": 5}) == 5
    assert made_up({"anyOf": [{"enum": ["a"]}, {"type": "null"}]}) == "a"
