"""The job registry: plugins found by entry point and TURNSTILE_JOBS; broken ones reported."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import plugins
from turnstile.jobs.declare import tool
from turnstile.jobs.errors import JobDefinitionError, ParamsError, UnknownJobError
from turnstile.jobs.job import Job
from turnstile.jobs.runs import new_run
from turnstile.jobs.tools import ToolContext
from turnstile.worker.registry import Registry

P = "tests.plugins"


def test_the_builtin_support_job_comes_from_its_entry_point() -> None:
    """support is registered through the `turnstile.jobs` entry point, like any plugin."""
    registry = Registry(None, spec="")
    assert registry.names() == ["support"]
    (row,) = registry.describe()
    assert row["source"] == "entry point support = turnstile.support:support"
    assert row["dimensions"] == ["refund_cents"]
    assert "amount_cents" in row["params_schema"]["properties"]


def test_each_broken_plugin_is_reported_and_the_others_still_load() -> None:
    """Import failure, a raising factory, a non-job, an invalid tool schema and a name taken
    twice each break only their plugin, with one line saying why."""
    spec = ",".join(
        [f"{P}:good", "no_such_module_xyz:job", f"{P}:raises", f"{P}:not_a_job",
         f"{P}:bad_schema", f"{P}:same_name", "no-colon"]
    )  # fmt: skip
    registry = Registry(None, spec=spec)
    assert registry.names() == ["support"]  # toy_good is claimed twice: neither runs
    why = {p.source.removeprefix("TURNSTILE_JOBS "): p.error for p in registry.broken()}
    assert "ModuleNotFoundError" in str(why["no_such_module_xyz:job"])
    assert why[f"{P}:raises"] == "RuntimeError: no credentials for the toy service"
    assert why[f"{P}:not_a_job"] == "TypeError: the factory returned dict, not a Job"
    assert "not valid JSON Schema" in str(why[f"{P}:bad_schema"])
    assert "registered twice" in str(why[f"{P}:good"])
    assert "registered twice" in str(why[f"{P}:same_name"])
    assert "expected module:attr" in str(why["no-colon"])
    with pytest.raises(UnknownJobError, match=r"job 'toy_good' is broken .*known jobs: support"):
        registry.get("toy_good")
    with pytest.raises(UnknownJobError, match="unknown job 'nope'; known jobs: support"):
        registry.get("nope")


def test_a_job_with_a_bad_model_string_is_broken_with_why_and_the_others_are_served() -> None:
    """A default model naming an unknown provider, or a fallback one slip from a known model,
    is checked when the job is registered: the job is listed broken, by its name, with the
    reason (and a run of it refused with it); the other jobs are served."""
    registry = Registry(None, spec=f"{P}:good,{P}:bad_provider,{P}:typo_fallback")
    assert registry.names() == ["support", "toy_good"]
    why = {p.name: p.error for p in registry.broken()}
    assert why == {
        "toy_bad_provider": "ProviderConfigError: unknown provider 'opneai' in model "
        "'opneai:gpt-4.1-mini'; did you mean openai:gpt-4.1-mini? (a provider is one of "
        "openai, anthropic; named endpoints come from TURNSTILE_MODEL_ENDPOINTS, which is "
        "not set)",
        "toy_typo_fallback": "ProviderConfigError: unknown model 'openai:gpt-4.1-mnii': did "
        "you mean openai:gpt-4.1-mini? (a model this process does not know yet is added, "
        "with its price, to the file named in TURNSTILE_PRICES_FILE)",
    }
    with pytest.raises(UnknownJobError, match=r"job 'toy_bad_provider' is broken \(Provider"):
        registry.get("toy_bad_provider")


def test_one_target_named_twice_is_one_registration(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`turnstile.support:support`, the support entry point's own target, named again in
    TURNSTILE_JOBS (spaced or not, and twice) is the one registration, not a name taken twice."""
    registry = Registry(None, spec="turnstile.support:support, turnstile.support : support")
    assert registry.names() == ["support"] and registry.broken() == []
    assert [p.source for p in registry.plugins] == [
        "entry point support = turnstile.support:support"
    ]
    twice = Registry(None, spec=f"{P}:good,{P}:good")
    assert twice.names() == ["support", "toy_good"] and twice.broken() == []


def test_a_factory_is_handed_the_client_when_it_takes_one() -> None:
    """A factory with a parameter gets the process's Redis client (None in process)."""
    plugins.CLIENTS.clear()
    sentinel = object()
    Registry(sentinel, spec=f"{P}:records_client")  # type: ignore[arg-type]
    assert sentinel in plugins.CLIENTS


def test_params_are_checked_against_the_jobs_schema_naming_the_key() -> None:
    """Unknown keys, wrong types and out-of-range values are refused, naming the key."""
    job = Registry(None, spec=f"{P}:good").get("toy_good")
    ok = {"run_id": "r1", "tenant": "t", "user_id": "u", "job": job, "goal": "g"}
    assert new_run(**ok, params={"level": 2}).params == {"level": 2}  # type: ignore[arg-type]
    for params, said in [
        ({"levle": 2}, "params.levle: unknown key for job 'toy_good' (known: level)"),
        ({"level": "2"}, "params.level: '2' is not of type 'integer'"),
        ({"level": 9}, "params.level: 9 is greater than the maximum of 3"),
    ]:
        with pytest.raises(ParamsError) as caught:
            new_run(**ok, params=params)  # type: ignore[arg-type]
        assert str(caught.value) == said


def test_a_tool_schema_derives_from_type_hints_and_bad_ones_are_refused() -> None:
    """@tool writes the argument schema from the hints; an invalid schema is a definition
    error, as is a params schema that is not JSON Schema."""
    assert plugins.echo.schema == {
        "type": "object",
        "properties": {"text": {"type": "string"}, "times": {"type": "integer"}},
        "required": ["text"],
        "additionalProperties": False,
    }
    assert plugins.echo.description == "Say the text back."
    assert plugins.echo.argument_problems({"text": 3}) == ["text: 3 is not of type 'string'"]
    with pytest.raises(JobDefinitionError, match="not valid JSON Schema"):
        tool(schema={"type": 5})(lambda ctx: {"status": "ok"})

    def unresolved(ctx: ToolContext, order: Undefined) -> None:  # type: ignore[name-defined]  # noqa: F821
        return None

    def blob(ctx: ToolContext, data: bytes) -> None:
        return None

    with pytest.raises(JobDefinitionError, match="type hints do not resolve"):
        tool(unresolved)
    with pytest.raises(JobDefinitionError, match="no JSON Schema for the type hint"):
        tool(blob)
    with pytest.raises(JobDefinitionError, match="params schema is not valid JSON Schema"):
        Job(name="x", tools={}, model=plugins.good().model, params_schema={"type": "obj"})

    @tool(charges={"refund_cents": "amount_cents"})
    def refund(ctx: ToolContext, amount_cents: int) -> dict[str, str]:
        """Refund an amount."""
        return {"status": "ok"}

    with pytest.raises(JobDefinitionError, match="charges undeclared dimensions"):
        Job(name="x", tools={"refund": refund}, model=plugins.good().model)


def test_a_broken_entry_point_is_named_and_a_run_of_it_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An installed distribution whose `turnstile.jobs` entry points fail to import, or give a
    job under another name, breaks only those entries; asking for one names why and lists the
    known jobs."""
    dist = tmp_path / "broken_plugins-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-plugins\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        "[turnstile.jobs]\nghost = no_such_module_abc:job\nwrongname = tests.plugins:good\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    registry = Registry(None, spec="")
    assert registry.names() == ["support"]
    why = {p.name: p.error for p in registry.broken()}
    assert str(why["ghost"]).startswith("ModuleNotFoundError: No module named 'no_such_module_abc'")
    assert why["wrongname"] == (
        "ValueError: registered as 'wrongname' but the job is named 'toy_good'"
    )
    with pytest.raises(UnknownJobError, match=r"job 'ghost' is broken \(ModuleNotFound"):
        registry.get("ghost")
