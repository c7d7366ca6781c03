"""Trace context in the step message and the GenAI attributes of spans, without I/O."""

from __future__ import annotations

from turnstile.jobs.trace import Span, semconv
from turnstile.worker.broker.message import StepMessage, parse_message
from turnstile.worker.observability.tracing import run_traceparent

KWARGS = {"tenant": "t", "run_id": "r", "version": 2, "queue": "q"}


def test_the_traceparent_travels_in_the_step_message_and_a_bad_one_is_dropped() -> None:
    """A step message carries the run's traceparent through its kwargs; a message without one,
    or with one that is not text, still parses, only without it."""
    parent = run_traceparent("r")
    msg = parse_message((), {**KWARGS, "traceparent": parent})
    assert isinstance(msg, StepMessage) and msg.traceparent == parent
    assert msg.as_kwargs()["traceparent"] == parent
    assert parse_message((), KWARGS) == StepMessage("t", "r", 2, "q")
    assert parse_message((), {**KWARGS, "traceparent": 7}) == StepMessage("t", "r", 2, "q")
    assert "traceparent" not in StepMessage("t", "r", 2, "q").as_kwargs()


def test_a_runs_trace_context_is_its_own_and_well_formed() -> None:
    """Every step of a run derives the same W3C traceparent from its id; other runs differ."""
    version, trace_id, span_id, flags = run_traceparent("run_1").split("-")
    assert (version, len(trace_id), len(span_id), flags) == ("00", 32, 16, "01")
    assert run_traceparent("run_1") == run_traceparent("run_1") != run_traceparent("run_2")


def test_model_and_tool_spans_carry_genai_attributes() -> None:
    """A model span names the operation, provider, models, usage and finish reason; a stopped
    one its error; a tool span the tool; other spans none."""
    usage = {"provider": "anthropic", "model": "claude-x-1", "cached_input_tokens": 5,
             "finish_reason": "tool_use"}  # fmt: skip
    model = Span(id="t1.model", parent="t1", kind="model", name="model.next", t0=0.0,
                 status="ok", attrs={"input_tokens": 10, "output_tokens": 3,
                                     "provider_usage": usage})  # fmt: skip
    assert semconv(model, "anthropic:claude-x") == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "anthropic",
        "gen_ai.request.model": "claude-x",
        "gen_ai.response.model": "claude-x-1",
        "gen_ai.usage.input_tokens": 10,
        "gen_ai.usage.output_tokens": 3,
        "gen_ai.usage.cache_read.input_tokens": 5,
        "gen_ai.response.finish_reasons": ["tool_use"],
    }
    stopped = Span(id="t1.model", parent="t1", kind="model", name="model.next", t0=0.0,
                   status="stop", attrs={"detail": "provider.refusal"})  # fmt: skip
    assert semconv(stopped, "openai:m")["error.type"] == "provider.refusal"
    tool = Span(id="t1.c1", parent="t1", kind="tool", name="get_order", t0=0.0)
    assert semconv(tool) == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "get_order",
    }
    assert semconv(Span(id="t1", parent=None, kind="turn", name="turn 1", t0=0.0)) == {}
