"""Spans for a run: task -> turn -> model / tool, with parent links, times, status and counts.

Span ids are derived from the turn number (`t3`, `t3.model`, `t3.c1`), so the spans of one turn
can be written by one worker and read back next to those of another without a shared counter.
The current span travels in a context variable; calls run on other threads carry it over, so
their spans keep their parent (a tool span with no parent would make the trace lie).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import msgspec

from turnstile.jobs.clock import Clock

ROOT_ID = "task"

current_span: ContextVar[str | None] = ContextVar("turnstile_current_span", default=None)


class Span(msgspec.Struct, kw_only=True):
    id: str
    parent: str | None
    kind: str  # task | turn | model | tool | resume
    name: str
    t0: float
    t1: float | None = None
    status: str = "open"
    attrs: dict[str, Any] = msgspec.field(default_factory=dict)

    @property
    def duration_s(self) -> float:
        return 0.0 if self.t1 is None else round(self.t1 - self.t0, 6)


class Trace:
    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.spans: list[Span] = []
        self._by_id: dict[str, Span] = {}

    def start(self, span_id: str, kind: str, name: str, parent: str | None, **attrs: Any) -> Span:
        return self.add(self.make(span_id, kind, name, parent, **attrs))

    def make(self, span_id: str, kind: str, name: str, parent: str | None, **attrs: Any) -> Span:
        """A span not yet in the trace: calls on other threads make theirs, and the turn adds
        them in proposal order, so the trace reads the same however the threads finished."""
        span = Span(id=span_id, parent=parent, kind=kind, name=name, t0=self.clock.now())
        span.attrs.update(attrs)
        return span

    def add(self, span: Span) -> Span:
        self.spans.append(span)
        self._by_id[span.id] = span
        return span

    def end(self, span: Span, status: str = "ok", *, t1: float | None = None, **attrs: Any) -> None:
        span.t1 = self.clock.now() if t1 is None else t1
        span.status = status
        span.attrs.update(attrs)

    def get(self, span_id: str) -> Span | None:
        return self._by_id.get(span_id)

    @contextmanager
    def current(self, span: Span) -> Iterator[Span]:
        token = current_span.set(span.id)
        try:
            yield span
        finally:
            current_span.reset(token)


def postmortem(spans: list[Span]) -> dict[str, Any]:
    """What a failed run's trace says at a glance: the first error, the most repeated call,
    model time against tool time, and the model's input size turn by turn."""
    tools = [s for s in spans if s.kind == "tool"]
    models = [s for s in spans if s.kind == "model"]
    first_error = next((s for s in tools if s.status != "ok"), None)
    calls = Counter(
        (s.name, json.dumps(s.attrs.get("args"), sort_keys=True)) for s in tools
    ).most_common(1)
    return {
        "first_error": [first_error.name, first_error.status] if first_error else None,
        "most_repeated": [calls[0][0][0], calls[0][0][1], calls[0][1]] if calls else None,
        "model_s": round(sum(s.duration_s for s in models), 3),
        "tool_s": round(sum(s.duration_s for s in tools), 3),
        "input_tokens_by_turn": [
            s.attrs["input_tokens"] for s in models if "input_tokens" in s.attrs
        ],
    }


def span_tree(spans: list[Span]) -> list[tuple[int, Span]]:
    """Spans in tree order with their depth, children in the order they started."""
    children: dict[str | None, list[Span]] = {}
    ids = {s.id for s in spans}
    for span in spans:
        parent = span.parent if span.parent in ids else None
        children.setdefault(parent, []).append(span)
    out: list[tuple[int, Span]] = []

    def walk(parent: str | None, depth: int) -> None:
        for child in children.get(parent, []):
            out.append((depth, child))
            walk(child.id, depth + 1)

    walk(None, 0)
    return out


def semconv(span: Span, request_model: str | None = None) -> dict[str, Any]:
    """OpenTelemetry GenAI semantic-convention attributes of a model or tool span (empty for
    other kinds): what a tracing backend shows for an LLM call and a tool execution."""
    attrs = span.attrs
    if span.kind == "tool":
        return {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": span.name}
    if span.kind != "model":
        return {}
    usage = attrs.get("provider_usage") or {}
    request_model = attrs.get("model") or request_model  # a fallback's, when it answered
    provider, colon, model = (request_model or "").partition(":")
    if not colon:  # a stand-in's name, not provider:model
        provider, model = "", request_model or ""
    out: dict[str, Any] = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": usage.get("provider") or provider or "turnstile",
        "gen_ai.request.model": model or request_model or "unknown",
    }
    pairs = (
        ("gen_ai.usage.input_tokens", attrs.get("input_tokens")),
        ("gen_ai.usage.output_tokens", attrs.get("output_tokens")),
        ("gen_ai.usage.cache_read.input_tokens", usage.get("cached_input_tokens")),
        ("gen_ai.usage.cache_creation.input_tokens", usage.get("cache_write_tokens")),
        ("gen_ai.usage.reasoning.output_tokens", usage.get("reasoning_tokens")),
        ("gen_ai.response.model", usage.get("model")),
    )
    out.update({k: v for k, v in pairs if v is not None})
    if usage.get("finish_reason"):
        out["gen_ai.response.finish_reasons"] = [usage["finish_reason"]]
    if span.status not in ("ok", "open"):
        out["error.type"] = str(attrs.get("detail") or span.status)
    return out
