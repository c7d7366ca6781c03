"""Export a run's spans over OTLP/HTTP, one trace per run across all its turns and workers.

Off unless TURNSTILE_OTLP_ENDPOINT is set (the collector's base URL; spans go to
`<endpoint>/v1/traces`): a worker process's `Exporter` is built once from its Settings
(`otlp_endpoint`) and held by its services.

Each step message carries the run's W3C `traceparent`; a message without one (the first step, a
sweeper's re-send) gets the run's own, derived from its id, so every turn of a run lands in the
same trace whichever worker ran it. A turn's spans are kept
with the run as before; after the commit they are also sent, each turn span a child of the
run's span, model and tool spans carrying the GenAI semantic-convention attributes; the run's
span itself (`invoke_agent <job>`) is sent when the run ends in a turn.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from collections.abc import Sequence
from contextvars import ContextVar
from typing import Any

import structlog

from turnstile.jobs.clock import Clock
from turnstile.jobs.outcomes import Outcome
from turnstile.jobs.state import RunState
from turnstile.jobs.trace import Span, semconv

log = structlog.get_logger("turnstile.tracing")

ENDPOINT_ENV = "TURNSTILE_OTLP_ENDPOINT"
EXPORT_TIMEOUT_S = 2.0  # a slow collector delays a step by at most this, then spans are dropped

_forced_ids: ContextVar[tuple[int, int] | None] = ContextVar("turnstile_otel_ids", default=None)


def run_traceparent(run_id: str) -> str:
    """The run's own W3C traceparent: trace and parent span ids derived from the run id."""
    digest = hashlib.sha256(run_id.encode()).hexdigest()
    return f"00-{digest[:32]}-{digest[32:48]}-01"


def _new_provider(endpoint: str) -> Any:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # noqa: PLC0415
        OTLPSpanExporter,
    )
    from opentelemetry.sdk.resources import Resource  # noqa: PLC0415
    from opentelemetry.sdk.trace import TracerProvider  # noqa: PLC0415
    from opentelemetry.sdk.trace.export import BatchSpanProcessor  # noqa: PLC0415
    from opentelemetry.sdk.trace.id_generator import RandomIdGenerator  # noqa: PLC0415

    class RunIds(RandomIdGenerator):
        """Random ids, except for a run's own span, whose ids come from its traceparent."""

        def generate_span_id(self) -> int:
            forced = _forced_ids.get()
            return forced[1] if forced else super().generate_span_id()

        def generate_trace_id(self) -> int:
            forced = _forced_ids.get()
            return forced[0] if forced else super().generate_trace_id()

    resource = Resource.create({"service.name": "turnstile", "process.pid": os.getpid()})
    provider = TracerProvider(resource=resource, id_generator=RunIds())
    exporter = OTLPSpanExporter(
        endpoint=f"{endpoint.rstrip('/')}/v1/traces", timeout=EXPORT_TIMEOUT_S
    )
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


class Exporter:
    """Sends a worker process's spans to the collector at `endpoint` (TURNSTILE_OTLP_ENDPOINT,
    given once from the Settings); with None or "" it sends nothing and loads nothing. Its
    tracer provider is built on the first span a process sends (after any fork)."""

    def __init__(self, endpoint: str | None) -> None:
        self.endpoint = endpoint or None
        self._lock = threading.Lock()
        self._providers: dict[int, Any] = {}  # pid -> TracerProvider

    def _provider(self) -> Any:
        pid = os.getpid()
        with self._lock:
            if pid not in self._providers:
                self._providers.clear()
                self._providers[pid] = _new_provider(str(self.endpoint))
            return self._providers[pid]

    def export_turn(
        self, traceparent: str, spans: Sequence[Span], clock: Clock, *, run_id: str,
        model: str | None,
    ) -> None:  # fmt: skip
        """Send a turn's spans under the run's trace; never raises (tracing must not fail a
        turn)."""
        if not self.endpoint or not spans:
            return
        try:
            _export(self._provider(), traceparent, spans, clock, run_id=run_id, model=model)
        except Exception as exc:
            log.warning("trace_export_failed", error=str(exc)[:200])

    def export_run_end(self, traceparent: str, state: RunState, model: str | None) -> None:
        """Send the run's own span, the parent of all its turns, once the run has ended. Its
        ids are those of the run's traceparent; it starts the run's active time before now (a
        run waiting for a person is not timed). Never raises."""
        if not self.endpoint or traceparent != run_traceparent(state.run_id):
            return  # a trace context from elsewhere: its parent span is not ours to send
        try:
            _export_run_end(self._provider(), traceparent, state, model)
        except Exception as exc:
            log.warning("trace_export_failed", error=str(exc)[:200])


def _value(value: Any) -> Any:
    """An attribute value OpenTelemetry accepts: a primitive, a list of strings, or JSON text."""
    if isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return value
    return json.dumps(value, sort_keys=True, default=str)[:2000]


def _export(
    provider: Any,
    traceparent: str,
    spans: Sequence[Span],
    clock: Clock,
    *,
    run_id: str,
    model: str | None,
) -> None:
    from opentelemetry import trace  # noqa: PLC0415
    from opentelemetry.trace.propagation.tracecontext import (  # noqa: PLC0415
        TraceContextTextMapPropagator,
    )

    tracer = provider.get_tracer("turnstile")
    run_context = TraceContextTextMapPropagator().extract({"traceparent": traceparent})
    # Span times are active time on the turn's clock; place them on the wall clock by how
    # long ago they were.
    now_ns, active_now = time.time_ns(), clock.now()

    def wall(t: float | None) -> int:
        return now_ns - int((active_now - (active_now if t is None else t)) * 1e9)

    contexts: dict[str, Any] = {}
    for span in spans:
        parent = contexts.get(span.parent or "", run_context)
        attrs = {f"turnstile.{k}": _value(v) for k, v in span.attrs.items() if v is not None}
        attrs.update({k: _value(v) for k, v in semconv(span, model).items()})
        attrs.update({"turnstile.run_id": run_id, "turnstile.span_id": span.id,
                      "turnstile.kind": span.kind, "turnstile.status": span.status})  # fmt: skip
        otel = tracer.start_span(
            _name(span, model), context=parent, attributes=attrs, start_time=wall(span.t0)
        )
        if span.status not in ("ok", "open"):
            otel.set_status(trace.Status(trace.StatusCode.ERROR, span.status))
        otel.end(end_time=max(wall(span.t1), wall(span.t0)))
        contexts[span.id] = trace.set_span_in_context(otel)
    provider.force_flush(int(EXPORT_TIMEOUT_S * 1000))


def _model_name(spec: str | None) -> str:
    """The model of `provider:model` (which may hold a colon itself), or a stand-in's name."""
    provider, colon, model = (spec or "").partition(":")
    return model if colon else provider


def _name(span: Span, model: str | None) -> str:
    """GenAI span names: `chat <model>`, `execute_tool <tool>`; others keep theirs."""
    if span.kind == "model":
        return f"chat {_model_name(span.attrs.get('model') or model) or 'model'}"
    if span.kind == "tool":
        return f"execute_tool {span.name}"
    return span.name


def _export_run_end(provider: Any, traceparent: str, state: RunState, model: str | None) -> None:
    from opentelemetry import trace  # noqa: PLC0415

    _, trace_hex, span_hex, _ = traceparent.split("-")
    now_ns = time.time_ns()
    attrs = {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": state.job,
        "gen_ai.request.model": _model_name(model) or "unknown",
        "turnstile.run_id": state.run_id,
        "turnstile.kind": "run",
        "turnstile.outcome": state.outcome.value if state.outcome else "",
        "turnstile.reason": state.reason or "",
        "turnstile.tokens": state.usage.tokens,
        "turnstile.cost_microusd": state.usage.cost_microusd,
    }
    token = _forced_ids.set((int(trace_hex, 16), int(span_hex, 16)))
    try:
        span = provider.get_tracer("turnstile").start_span(
            f"invoke_agent {state.job}",
            context=trace.set_span_in_context(trace.INVALID_SPAN),
            attributes=attrs,
            start_time=now_ns - state.usage.elapsed_ms * 1_000_000,
        )
    finally:
        _forced_ids.reset(token)
    if state.outcome is not Outcome.COMPLETED:
        span.set_status(trace.Status(trace.StatusCode.ERROR, state.outcome or "stopped"))
    span.end(end_time=now_ns)
    provider.force_flush(int(EXPORT_TIMEOUT_S * 1000))
