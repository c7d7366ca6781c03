"""The model interface, one scripted fake, and record/replay.

A model is shown the rendered view of the state and returns one reply: a plan, one tool call,
a batch of calls, or a final answer. It may report its latency and token usage; when it does
not, the kernel measures the time and estimates the tokens. A provider adapter (the
`providers` package, which this module never imports) also reports cached and reasoning
tokens and the call's cost at its model's prices, and ends the run with `ModelStop` when the
provider's answer leaves nothing for the model to do (a refusal, a rejected key).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgspec

from turnstile.errors import TurnstileError
from turnstile.jobs.budget import est_tokens
from turnstile.jobs.live import NO_LIVE, LiveSink
from turnstile.jobs.outcomes import Outcome
from turnstile.jobs.state import Call


@dataclass(frozen=True)
class ToolSpec:
    """A tool as a model is told about it: what a provider turns into a function definition."""

    name: str
    description: str
    schema: Mapping[str, Any]


@dataclass(frozen=True)
class ModelRequest:
    """What one model call is given: the rendered view of the state, the output cap, the
    time left, the turn's number, the job's tools, and the previous turn's calls and their
    results (for an adapter that pairs each call with its result)."""

    view: str
    max_output_tokens: int
    timeout_s: float  # the run's remaining active time
    step: int  # the 1-based number of this turn, so a stateless model can count
    tools: tuple[ToolSpec, ...] = ()
    # The previous turn's calls, whose observations are in `last_result`: a provider that
    # pairs each tool call with its result re-creates that one exchange from them.
    previous_calls: tuple[Call, ...] = ()
    last_result: Any = None
    # Where the model may say its answer's words as they come (jobs/live.py): a provider
    # adapter streams when it is on; what it says is never the turn's result.
    live: LiveSink = field(default=NO_LIVE, compare=False, repr=False)


@dataclass(frozen=True)
class ModelResponse:
    """What a model answered: the reply (a plan, a call, a batch or a final answer, checked by
    the kernel), and what it can say of its latency, tokens and cost (measured or estimated
    when it says nothing)."""

    reply: Any  # the parsed JSON the model produced; validated by the kernel, not trusted
    latency_s: float | None = None
    input_tokens: int | None = None  # provider usage, when the provider reports it: all input
    output_tokens: int | None = None  # all output, reasoning included
    cached_input_tokens: int | None = None  # of input_tokens, read from the provider's cache
    cache_write_tokens: int | None = None  # of input_tokens, written to the provider's cache
    reasoning_tokens: int | None = None  # of output_tokens, spent on reasoning
    cost_microusd: int | None = None  # the reported usage at the model's prices
    provider: str | None = None  # e.g. "openai", for the trace
    model: str | None = None  # the model as the provider named it in its answer
    finish_reason: str | None = None
    # The model string that answered (`openai:gpt-4.1-mini`, `local:llama3`), and, when a
    # fallback answered, why the run's first model did not: what the turn's span records.
    answered_by: str | None = None
    fallback: str | None = None

    def usage_attrs(self) -> dict[str, Any] | None:
        """What the provider reported, as span attributes; None when it reported nothing."""
        fields = {
            name: getattr(self, name) for name in USAGE_FIELDS if getattr(self, name) is not None
        }
        return fields or None


USAGE_FIELDS = (
    "input_tokens",
    "output_tokens",
    "cached_input_tokens",
    "cache_write_tokens",
    "reasoning_tokens",
    "cost_microusd",
    "provider",
    "model",
    "finish_reason",
)


def is_provider_model(kind: object) -> bool:
    """Whether a `model` parameter names a real model, `provider:model` (`openai:gpt-4.1-mini`),
    rather than one of a job's stand-ins."""
    return isinstance(kind, str) and ":" in kind


MAX_MODEL_CHARS = 200
_SPEC = re.compile(r"[a-z][a-z0-9_\-]{0,31}:\S{1,200}")
SPEC_HINT = "provider:model (openai:gpt-4.1-mini, anthropic:claude-sonnet-4-6, or endpoint:model)"


def spec_problem(spec: object) -> str | None:
    """What is wrong with the form of a model string, or None: `provider:model`, where the
    provider is `openai`, `anthropic` or a named endpoint. Whether that provider exists here
    is the providers package's question, asked at submit and when the run's model is built."""
    if not isinstance(spec, str):
        return f"a model string must be text, not {type(spec).__name__}"
    if len(spec) > MAX_MODEL_CHARS or not _SPEC.fullmatch(spec):
        return f"{spec[:80]!r} is not a model string {SPEC_HINT}"
    return None


CONTRACT_TOKENS = 600  # a provider request's own text: system prompt, plan and final functions


def provider_overhead_tokens(
    tools: Iterable[Any], last_result: Any, *, definitions: int | None = None
) -> int:
    """What a provider request carries besides the view, estimated: the tools as function
    definitions (`definitions`, when the caller counted them already: `Job.definition_tokens`),
    the previous exchange (its results again), and the contract's own text."""
    if definitions is None:
        definitions = definition_tokens(tools)
    return definitions + est_tokens(json.dumps(last_result)) + CONTRACT_TOKENS


def definition_tokens(tools: Iterable[Any]) -> int:
    """The tools as a provider's function definitions, estimated."""
    return est_tokens(
        json.dumps([[t.name, t.description, t.schema] for t in tools], sort_keys=True, default=str)
    )


class ModelError(TurnstileError):
    """A model adapter's signal to the kernel, which handles each kind within the turn (a
    timeout, a stop, a failure replayed); none of them reaches the kernel's caller."""


class ModelTimeout(ModelError):  # noqa: N818 - named for what happened, like TimeoutError
    """Raised by a model adapter whose call outlived the timeout it was given."""


class ModelStop(ModelError):  # noqa: N818 - the model's side stopped the run
    """Raised by a model adapter when the provider's answer ends the run: a refusal, a rejected
    key, a request over the context window, a rate limit that outlasts the deadline. Carries the
    outcome, a reason a person can act on, and what the provider billed for the attempts."""

    def __init__(
        self,
        outcome: Outcome,
        reason: str,
        detail: str,
        spent: ModelResponse | None = None,
    ) -> None:
        super().__init__(reason)
        self.outcome, self.reason, self.detail = outcome, reason, detail
        self.spent = spent or ModelResponse(None)


class ModelUnavailable(ModelStop):
    """Raised by a model adapter whose provider kept failing in a way a retry could fix (a rate
    limit, a 5xx, no connection) until its attempts or the time before the deadline ran out.
    It ends the run like any `ModelStop`, unless the run names a fallback model, which is then
    asked with the time that is left."""


class Model(Protocol):
    """What a run's model is: one reply per turn. `next` is given the rendered view and the
    remaining time, and returns the reply with what it cost; it raises `ModelTimeout` when it
    outlived `request.timeout_s`, and `ModelStop` when the provider's answer ends the run."""

    def next(self, request: ModelRequest) -> ModelResponse:
        """The reply to one turn's request."""
        ...


def is_model(obj: object) -> bool:
    """Whether an object can be a run's model: an instance with a callable `next`."""
    return not isinstance(obj, type) and callable(getattr(obj, "next", None))


class Scripted:
    """Replies from a function of (view as parsed JSON, turn number), at a fixed latency."""

    def __init__(self, fn: Callable[[Any, int], Any], latency_s: float = 1.5) -> None:
        self.fn = fn
        self.latency_s = latency_s

    def next(self, request: ModelRequest) -> ModelResponse:
        """The function's reply to this turn's view, reported at the fixed latency; a final
        answer's text is said to the live sink too, as a streaming model would say it."""
        reply = self.fn(json.loads(request.view), request.step)
        say_answer(request.live, reply)
        return ModelResponse(reply, self.latency_s)


def say_answer(live: LiveSink, reply: Any) -> None:
    """A final answer's text said to the live sink at once: what a model that does not stream
    word by word says, so a live reader sees the answer before the turn commits."""
    if live.on and isinstance(reply, Mapping) and reply.get("type") == "final":
        text = reply.get("text")
        if isinstance(text, str) and text:
            live.text(text)


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


class RecordedFailure(ModelError):  # noqa: N818 - it is the failure, replayed
    """A model failure as it was recorded in a trace, raised again on replay."""


def _reported(attrs: Mapping[str, Any]) -> dict[str, Any]:
    """A model span's reported usage as response fields (older spans carry a pair)."""
    usage = attrs.get("provider_usage")
    if isinstance(usage, Mapping):
        return {k: v for k, v in usage.items() if k in USAGE_FIELDS}
    reported = attrs.get("reported_usage") or [None, None]
    return {"input_tokens": reported[0], "output_tokens": reported[1]}


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
        elif span.status == "stop":
            spent = ModelResponse(None, attrs.get("latency_s"), **_reported(attrs))
            outcome = msgspec.convert(attrs["outcome"], Outcome)
            out.append(ModelStop(outcome, attrs["reason"], attrs["detail"], spent))
        elif span.status == "deadline" and attrs.get("timeout"):
            out.append(ModelTimeout())
        elif span.status == "deadline":
            out.append(ModelResponse(None, attrs["latency_s"]))
        else:
            said = {"answered_by": attrs.get("model"), "fallback": attrs.get("fallback")}
            out.append(
                ModelResponse(attrs.get("reply"), attrs["latency_s"], **_reported(attrs), **said)
            )
    return out
