"""A tool declared wrongly is refused when it is defined, naming the tool and the fix: no
ToolContext first parameter, key_args or other names that are not arguments, no description,
options of the wrong type. A plugin holding one is shown broken by `turnstile jobs`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tests.unit.kit import Listed, go, make_job
from turnstile import JobDefinitionError, ToolContext, tool
from turnstile.jobs.outcomes import Outcome
from turnstile.worker.cli.main import app
from turnstile.worker.registry import Registry


def test_a_function_without_the_context_is_refused_naming_the_fix() -> None:
    """`@tool` on `def f(order_id: str)` no longer takes order_id as the context: it is refused,
    and the message shows both ways to write it."""
    with pytest.raises(JobDefinitionError) as caught:

        @tool
        def track(order_id: str) -> dict[str, Any]:
            """Track an order."""
            return {}

    assert str(caught.value) == (
        "tool 'track': its first parameter 'order_id' is str, not the ToolContext: write "
        "`def track(ctx: ToolContext, ...)`, or declare a tool that needs no context with "
        "`@tool(context=False)`"
    )
    with pytest.raises(JobDefinitionError, match="tool 'noop' takes no ToolContext first"):

        @tool
        def noop() -> None:
            """Do nothing."""

    with pytest.raises(JobDefinitionError, match="'order_id' is not annotated ToolContext"):
        tool(description="d")(lambda order_id: None)


def test_a_tool_declared_without_context_takes_only_its_arguments() -> None:
    """`@tool(context=False)` derives the schema from every parameter and calls the function
    with the arguments alone."""

    @tool(context=False)
    def add(a: int, b: int = 1) -> int:
        """Add two numbers."""
        return a + b

    assert add.schema["properties"] == {"a": {"type": "integer"}, "b": {"type": "integer"}}
    assert add.schema["required"] == ["a"]
    ran = go(make_job([add]), Listed([{"type": "tool", "name": "add", "args": {"a": 2}}]))
    assert ran.state.outcome is Outcome.COMPLETED
    assert ran.state.last_result == {"status": "ok", "result": 3}


@pytest.mark.parametrize(
    ("options", "said"),
    [
        ({"key_args": ("orderid",)},
         "tool 'refund': key_args names 'orderid', which is not one of its arguments "
         "(amount_cents, order_id): name an argument of the tool"),
        ({"fact_scope": "order"}, "tool 'refund': fact_scope names 'order', which is not"),
        ({"charges": {"refund_cents": "amount"}},
         "tool 'refund': charges['refund_cents'] names 'amount', which is not"),
        ({"key_args": "order_id"},
         "tool 'refund': key_args must be a tuple of names, e.g. key_args=('order_id',)"),
        ({"facts": "refunded_cents"}, "tool 'refund': facts must be a tuple of names"),
        ({"mutates": "yes"}, "tool 'refund': mutates must be True or False"),
        ({"cost_bound_microusd": 1.5},
         "tool 'refund': cost_bound_microusd must be a whole number of micro-dollars >= 0"),
        ({"cost_bound_microusd": -1}, "tool 'refund': cost_bound_microusd must be a whole"),
        ({"timeout_s": 0}, "tool 'refund': timeout_s must be seconds > 0"),
    ],
)  # fmt: skip
def test_options_that_are_not_the_tools_arguments_or_of_the_wrong_type_are_refused(
    options: dict[str, Any], said: str
) -> None:
    """key_args, fact_scope and a charge's bound must name arguments; names are a tuple, not
    one string; flags are booleans, bounds numbers: each mistake is one line naming the tool."""
    with pytest.raises(JobDefinitionError) as caught:

        @tool(**options)
        def refund(ctx: ToolContext, order_id: str, amount_cents: int) -> dict[str, Any]:
            """Refund part of an order."""
            return {}

    assert str(caught.value).startswith(said)


def test_a_tool_without_a_description_is_refused() -> None:
    """No docstring and no description: refused, since the model chooses tools by it."""
    with pytest.raises(JobDefinitionError) as caught:

        @tool
        def lookup(ctx: ToolContext, order_id: str) -> dict[str, Any]:
            return {}

    assert str(caught.value) == (
        "tool 'lookup' has no description: give lookup a docstring saying what it does (the "
        "model chooses tools by it), or @tool(description=...)"
    )
    assert tool(description="Look it up.")(lookup_fn).description == "Look it up."


def lookup_fn(ctx: ToolContext, order_id: str) -> dict[str, Any]:
    return {}


BAD_PLUGIN = '''
from turnstile import Job, Scripted, ToolContext, tool


@tool(key_args=("orderid",))
def refund(ctx: ToolContext, order_id: str) -> dict:
    """Refund an order."""
    return {}


def job():
    return Job(name="bad_tools", tools={"refund": refund}, model=lambda p: Scripted(None, 0))
'''


def test_a_plugin_with_a_wrongly_declared_tool_is_shown_broken_by_turnstile_jobs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The definition error is raised when the plugin is loaded: the registry records it as
    broken with the message, and `turnstile jobs` shows it."""
    (tmp_path / "bad_tools_plugin.py").write_text(BAD_PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    registry = Registry(None, spec="bad_tools_plugin:job")
    (broken,) = registry.broken()
    said = (
        "JobDefinitionError: tool 'refund': key_args names 'orderid', which is not one of its "
        "arguments (order_id): name an argument of the tool"
    )
    assert broken.error == said
    out = CliRunner().invoke(
        app, ["jobs", "--json"], env={"TURNSTILE_JOBS": "bad_tools_plugin:job"}
    )
    rows = {r["source"]: r for r in json.loads(out.stdout)}
    assert rows["TURNSTILE_JOBS bad_tools_plugin:job"]["status"] == "broken"
    assert rows["TURNSTILE_JOBS bad_tools_plugin:job"]["error"] == said
