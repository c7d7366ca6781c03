"""The model interface, one scripted fake, and record/replay.

A model is shown the rendered view of the state and returns one reply: a plan, one tool call,
a batch of calls, or a final answer. It may report its latency and token usage; when it does
not, the kernel measures the time and estimates the tokens.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class ModelRequest:
    view: str
    max_output_tokens: int
    timeout_s: float  # the run's remaining active time
    step: int  # the 1-based number of this turn, so a stateless model can count


@dataclass(frozen=True)
class ModelResponse:
    reply: Any  # the parsed JSON the model produced; validated by the kernel, not trusted
    latency_s: float | None = None
    input_tokens: int | None = None  # provider usage, when the provider reports it
    output_tokens: int | None = None


class ModelTimeout(Exception):  # noqa: N818 - named for what happened, like TimeoutError
    """Raised by a model adapter whose call outlived the timeout it was given."""


class Model(Protocol):
    def next(self, request: ModelRequest) -> ModelResponse: ...


class Scripted:
    """Replies from a function of (view as parsed JSON, turn number), at a fixed latency."""

    def __init__(self, fn: Callable[[Any, int], Any], latency_s: float = 1.5) -> None:
        self.fn = fn
        self.latency_s = latency_s

    def next(self, request: ModelRequest) -> ModelResponse:
        return ModelResponse(self.fn(json.loads(request.view), request.step), self.latency_s)


class Recorder:
    """Wraps a model and keeps its responses, so the run can be replayed without it."""

    def __init__(self, inner: Model) -> None:
        self.inner = inner
        self.responses: list[ModelResponse] = []

    def next(self, request: ModelRequest) -> ModelResponse:
        response = self.inner.next(request)
        self.responses.append(response)
        return response


class Replay:
    """Returns recorded responses in order, and raises recorded failures where they happened.
    Running out is a harness defect, not a reply."""

    def __init__(self, responses: Sequence[ModelResponse | Exception]) -> None:
        self.responses = list(responses)
        self.index = 0

    def next(self, request: ModelRequest) -> ModelResponse:
        if self.index >= len(self.responses):
            raise IndexError(f"replay has {len(self.responses)} responses; turn {request.step}")
        response = self.responses[self.index]
        self.index += 1
        if isinstance(response, Exception):
            raise response
        return response


class RecordedFailure(Exception):  # noqa: N818 - it is the failure, replayed
    """A model failure as it was recorded in a trace, raised again on replay."""


def responses_from_spans(spans: Sequence[Any]) -> list[ModelResponse | Exception]:
    """The model's side of a run, recovered from its model spans, in order: what `Replay`
    needs to run the kernel again without the model."""
    out: list[ModelResponse | Exception] = []
    for span in spans:
        if span.kind != "model":
            continue
        attrs = span.attrs
        if span.status == "error":
            out.append(RecordedFailure(attrs.get("error", "model error")))
        elif span.status == "deadline" and attrs.get("timeout"):
            out.append(ModelTimeout())
        elif span.status == "deadline":
            out.append(ModelResponse(None, attrs["latency_s"]))
        else:
            reported = attrs.get("reported_usage") or [None, None]
            out.append(
                ModelResponse(attrs.get("reply"), attrs["latency_s"], reported[0], reported[1])
            )
    return out
