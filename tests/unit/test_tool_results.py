"""What a tool gives back, as the model and the views see it: plain values are ok observations,
ToolError is an error the model sees, any other exception is `tool_raised` and logged once,
and what is not JSON (or too big) is a one-line `bad_result` that keeps nothing of it."""

from __future__ import annotations

import datetime
from typing import Any

import pytest
import structlog

from tests.unit.kit import Listed, call, go, make_job
from turnstile import ToolContext, ToolError, ToolOutput, tool
from turnstile.jobs.budget import Budget
from turnstile.jobs.outcomes import Outcome, Status
from turnstile.jobs.tools import MAX_RESULT_BYTES, Tool


def returning(value: Any, name: str = "lookup", **options: Any) -> Tool:
    @tool(name=name, description="Look something up.", **options)
    def lookup(ctx: ToolContext, id: str) -> Any:
        if isinstance(value, BaseException):
            raise value
        return value

    return lookup


@pytest.mark.parametrize(
    "value",
    [
        {"status": "shipped", "eta": "2025-06-01"},
        {"status": "error"},  # a field of the domain, not the envelope
        "in transit",
        ["a", 1, None, {"b": [True]}],
        (1, 2),
        42,
        2.5,
        False,
        None,
    ],
)
def test_any_json_value_a_tool_returns_is_an_ok_observation(value: Any) -> None:
    """A plain value (a dict whatever its keys, text, a list, a number, a bool, None) is shown
    to the model as `{"status": "ok", "result": value}` and the run completes."""
    ran = go(make_job([returning(value)]), Listed([call("lookup")]))
    assert ran.state.outcome is Outcome.COMPLETED
    expected = list(value) if isinstance(value, tuple) else value
    assert ran.state.last_result == {"status": "ok", "result": expected}
    tool_span = next(s for s in ran.trace.spans if s.kind == "tool")
    assert tool_span.status == "ok" and ran.state.failures == {}


def test_facts_come_from_the_fields_of_a_plain_dict() -> None:
    """The allow-listed fields of a returned dict become facts, prefixed by the scope."""
    lookup = returning({"status": "shipped", "eta": "soon", "x": 1}, facts=("status", "eta"),
                       fact_scope="id")  # fmt: skip
    ran = go(make_job([lookup]), Listed([call("lookup", "o1")]))
    assert ran.state.facts == {"o1.status": "shipped", "o1.eta": "soon"}


def test_the_issue_19_shipped_status_no_longer_loops() -> None:
    """The tool of the report, returning `{"status": "shipped", ...}` each time it is asked,
    gives the model its answer: one call, then the final answer, not loop_detected."""
    replies = [call("lookup", "o1"), {"type": "final", "outcome": "completed", "text": "Shipped."}]
    ran = go(make_job([returning({"status": "shipped", "tracking": "1Z"})]), Listed(replies))
    assert (ran.state.outcome, ran.state.usage.tool_calls) == (Outcome.COMPLETED, 1)


def test_a_tool_error_is_the_error_the_model_sees_and_not_a_failing_dependency() -> None:
    """`raise ToolError(code, detail)` is `{"status": "error", "code", "detail"}`; it is not
    logged and does not count toward tool_failure, however often it is raised."""
    failing = returning(ToolError("out_of_stock", {"sku": "A1", "back_in_days": 3}))
    with structlog.testing.capture_logs() as logs:
        ran = go(make_job([failing]), Listed([call("lookup", f"i{i}") for i in range(4)]),
                 Budget(max_stalls=10))  # fmt: skip
    assert ran.state.last_result == {
        "status": "error", "code": "out_of_stock", "detail": {"sku": "A1", "back_in_days": 3}
    }  # fmt: skip
    assert ran.state.outcome is Outcome.COMPLETED and ran.state.failures == {}
    assert logs == []
    tool_span = next(s for s in ran.trace.spans if s.kind == "tool")
    assert (tool_span.status, tool_span.attrs["detail"]) == (
        "out_of_stock", '{"sku":"A1","back_in_days":3}'
    )  # fmt: skip


@pytest.mark.parametrize(
    ("raised", "detail"),
    [
        (ToolError("", "x"), "ToolError needs a code of 1-64 characters, got ''"),
        (ToolError("nope", {1, 2}), "nope"),  # a detail that is not JSON is shown as text
    ],
)
def test_a_tool_error_without_a_code_is_a_bad_result(raised: ToolError, detail: str) -> None:
    """A ToolError whose code is empty is a bad_result naming why; a detail that is not JSON
    becomes its text."""
    ran = go(make_job([returning(raised)]), Listed([call("lookup")]), Budget(max_steps=1))
    assert isinstance(ran.state.last_result, dict)
    if raised.code:
        assert ran.state.last_result == {"status": "error", "code": "nope", "detail": "{1, 2}"}
    else:
        assert ran.state.last_result == {"status": "error", "code": "bad_result", "detail": detail}


def test_a_raise_is_tool_raised_with_its_type_and_message_and_logged_once() -> None:
    """Any other exception is `tool_raised` carrying `Type: message` on one bounded line, shown
    on the tool's span, and logged once with its traceback, bound to run, turn and tool."""
    boom = returning(RuntimeError("orders database\nis on fire " + "x" * 500))
    with structlog.testing.capture_logs() as logs:
        ran = go(make_job([boom]), Listed([call("lookup", "o1")]), Budget(max_steps=1))
    assert isinstance(ran.state.last_result, dict)
    detail = ran.state.last_result["detail"]
    assert ran.state.last_result["code"] == "tool_raised"
    assert detail.startswith("RuntimeError: orders database is on fire xxx")
    assert len(detail) == 200 and "\n" not in detail
    (line,) = logs
    assert (line["event"], line["log_level"], line["run_id"], line["turn"], line["tool"]) == (
        "tool_raised", "error", "r1", 1, "lookup"
    )  # fmt: skip
    assert isinstance(line["exc_info"], RuntimeError)
    assert line["exc_info"].__traceback__ is not None  # the traceback goes with it
    tool_span = next(s for s in ran.trace.spans if s.kind == "tool")
    assert (tool_span.status, tool_span.attrs["detail"]) == ("tool_raised", detail)


class Opaque:
    pass


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ({1, 2}, "not JSON: result is a set, not a JSON value"),
        (datetime.datetime(2025, 1, 1, tzinfo=datetime.UTC),
         "not JSON: result is a datetime, not a JSON value"),
        ({"order": {"when": datetime.date(2025, 1, 1)}},
         "not JSON: result.order.when is a date, not a JSON value"),
        ([Opaque()], "not JSON: result[0] is a Opaque, not a JSON value"),
        ({1: "a"}, "not JSON: result has a key that is not text (int 1)"),
        (float("nan"), "not JSON: result is nan, which JSON cannot carry"),
        (b"bytes", "not JSON: result is a bytes, not a JSON value"),
    ],
)  # fmt: skip
def test_a_value_that_is_not_json_is_a_one_line_bad_result(value: Any, said: str) -> None:
    """A set, a datetime, an object (anywhere in the value) is refused with a one-line reason
    naming where; nothing of the value is kept in the state."""
    ran = go(make_job([returning(value)]), Listed([call("lookup")]), Budget(max_steps=1))
    assert ran.state.last_result == {"status": "error", "code": "bad_result", "detail": said}
    assert ran.state.failures == {"lookup": 1}


def test_a_value_that_is_not_json_is_logged_once_with_its_type() -> None:
    """A bad_result is logged once, an error bound to the run, the turn and the tool, naming
    the value's type and what was wrong (the trace alone showed it before); a tool's own
    error code `bad_result` is its answer, not logged."""
    with structlog.testing.capture_logs() as logs:
        go(make_job([returning({"when": datetime.date(2025, 1, 1)})]),
           Listed([call("lookup", "o1")]), Budget(max_steps=1))  # fmt: skip
    (line,) = logs
    assert line == {
        "event": "tool_bad_result", "log_level": "error", "run_id": "r1", "turn": 1,
        "tool": "lookup", "call": line["call"], "key": line["key"], "value_type": "dict",
        "detail": "not JSON: result.when is a date, not a JSON value",
    }  # fmt: skip
    with structlog.testing.capture_logs() as logs:
        go(make_job([returning(ToolError("bad_result", "the tool's own word"))]),
           Listed([call("lookup", "o1")]), Budget(max_steps=1))  # fmt: skip
    assert logs == []


def test_a_huge_value_is_a_bad_result_and_the_state_stays_small() -> None:
    """A tool returning 10 MB is a bad_result saying how big it was; the state does not grow."""
    ran = go(make_job([returning("x" * 10_000_000)]), Listed([call("lookup")]),
             Budget(max_steps=1))  # fmt: skip
    assert ran.state.last_result == {
        "status": "error", "code": "bad_result",
        "detail": f"result of 10000002 bytes is over {MAX_RESULT_BYTES}",
    }  # fmt: skip
    assert len(ran.state.to_json()) < 20_000


def test_the_status_envelope_still_holds_a_call_for_approval() -> None:
    """A ToolOutput carries the envelope: `needs_approval` suspends the run on that call."""

    @tool(mutates=True)
    def ship(ctx: ToolContext, id: str) -> ToolOutput:
        """Ship an order."""
        if ctx.approved:
            return ToolOutput({"status": "ok", "shipped": True})
        return ToolOutput({"status": "needs_approval", "reason": "large order"})

    ran = go(make_job([ship]), Listed([call("ship", "o1")]))
    assert (ran.state.status, ran.state.outcome) == (Status.SUSPENDED, Outcome.NEEDS_APPROVAL)
    assert ran.state.pending is not None and ran.state.pending.call.name == "ship"
