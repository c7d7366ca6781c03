"""Anthropic Messages with `tool_use`. For `anthropic:` the base URL and key come from the
SDK's own variables, ANTHROPIC_BASE_URL and ANTHROPIC_API_KEY; a named endpoint has its own.

Usage is normalised: Anthropic's `input_tokens` leaves out the tokens read from the cache
(`cache_read_input_tokens`) and written to it (`cache_creation_input_tokens`), so all input is
their sum; `output_tokens` includes thinking, which `output_tokens_details` breaks out.
"""

from __future__ import annotations

import functools
import json
from dataclasses import replace
from typing import Any

import anthropic
import httpx2

from turnstile.jobs.live import LiveSink
from turnstile.jobs.model import ModelRequest, ModelResponse, ModelStop
from turnstile.jobs.outcomes import Outcome
from turnstile.providers import contract, sdk
from turnstile.providers.endpoints import BUILT_IN_ROUTES, Route
from turnstile.providers.prices import Price, Tokens
from turnstile.providers.retry import Failure, StreamCut, one_line, retry_after_s, with_retries
from turnstile.providers.sdk import sdk_client

PROVIDER = "anthropic"
_CONTEXT_WORDS = ("prompt is too long", "context window", "context length")


def _body_error(exc: anthropic.APIStatusError) -> tuple[str, str]:
    """(type, message) of an error body: {"type": "error", "error": {"type", "message"}}."""
    body: dict[str, Any] = exc.body if isinstance(exc.body, dict) else {}
    error = body.get("error")
    inner: dict[str, Any] = error if isinstance(error, dict) else body
    return str(inner.get("type") or ""), str(inner.get("message") or exc.message)[:200]


def classify(exc: Exception, route: Route = BUILT_IN_ROUTES[PROVIDER]) -> Failure | None:
    """What a failed attempt means for the run; `route` names the server in the reason. A
    stream cut mid-way is what a reply cut in transit is: retried."""
    if isinstance(exc, anthropic.APITimeoutError | httpx2.TimeoutException):
        return Failure("timeout", "the call timed out")
    if isinstance(exc, anthropic.APIConnectionError):
        return Failure("retry", f"{route.name} unreachable: {exc}")
    if isinstance(exc, StreamCut | httpx2.TransportError | json.JSONDecodeError):
        return Failure("retry", f"{route.name}'s stream was cut: {one_line(exc)}")
    if not isinstance(exc, anthropic.APIStatusError):
        if isinstance(exc, anthropic.APIError):  # an error event inside the stream
            return Failure("retry", f"{route.name}'s stream failed: {one_line(exc)}")
        return None
    return _status_failure(exc, route)


def _status_failure(exc: anthropic.APIStatusError, route: Route) -> Failure:
    kind, message = _body_error(exc)
    status, name = exc.status_code, route.name
    wait = retry_after_s(exc.response.headers)
    if status == 429:
        asked = f" (asked to wait {wait:g} s)" if wait is not None else ""
        return Failure(
            "retry", f"rate limited by {name}{asked}: {message}", wait_s=wait, rate_limited=True
        )
    failure = Failure(
        "stop", f"{name} rejected the request ({status} {kind}): {message}",
        detail="provider.rejected",
    )  # fmt: skip
    if status in (401, 403):
        failure = Failure(
            "stop", f"{name} refused the key ({status}): {message}; check {route.key_env}",
            detail="provider.authentication",
        )  # fmt: skip
    elif status == 400 and any(w in message.lower() for w in _CONTEXT_WORDS):
        failure = Failure(
            "stop", f"the request is longer than the model's context window: {message}",
            detail="provider.context_length",
        )  # fmt: skip
    elif status in (408, 409) or status >= 500:  # 529: overloaded; it may say when to return
        failure = Failure("retry", f"{name} failed ({status} {kind}): {message}", wait_s=wait)
    return failure


def request_messages(request: ModelRequest) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": request.view}]
    past = contract.past_calls(request)
    if past:
        messages.append(
            {
                "role": "assistant",
                "content": [
                    {"type": "tool_use", "id": c.id, "name": c.name, "input": c.arguments}
                    for c in past
                ],
            }
        )
        messages.append(
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": c.id,
                        "content": c.result_text,
                        "is_error": c.failed,
                    }
                    for c in past
                ],
            }
        )
    return messages


def request_tools(request: ModelRequest) -> list[dict[str, Any]]:
    return [
        {"name": f.name, "description": f.description, "input_schema": dict(f.parameters)}
        for f in contract.functions(request.tools)
    ]


def usage_of(message: Any) -> Tokens:
    usage = message.usage
    cached = usage.cache_read_input_tokens or 0
    written = usage.cache_creation_input_tokens or 0
    details = getattr(usage, "output_tokens_details", None)
    return Tokens(
        input=usage.input_tokens + cached + written,
        cached_input=cached,
        cache_write=written,
        output=usage.output_tokens,
        reasoning=(getattr(details, "thinking_tokens", 0) or 0) if details else 0,
    )


def streamed(manager: Any, live: LiveSink) -> Any:
    """The message a stream of events adds up to (the SDK's own accumulation), its final
    answer's words said to `live` as they come. A stream that ends before its stop reason is
    cut (`StreamCut`): the words said are abandoned and the attempt fails as a reply cut in
    transit does."""
    names: dict[int, str] = {}
    arguments: dict[int, str] = {}
    answers: dict[int, contract.AnswerText] = {}
    said = False
    try:
        with manager as events:
            for event in events:
                if event.type == "content_block_start":
                    names[event.index] = getattr(event.content_block, "name", "")
                elif event.type == "input_json":
                    index = _index_of(events)
                    arguments[index] = arguments.get(index, "") + event.partial_json
                    answer = answers.setdefault(index, contract.AnswerText())
                    words = answer.feed(names.get(index), arguments[index])
                    if words:
                        said = True
                        live.text(words)
            message = events.get_final_message()
        if message.stop_reason is None:
            raise StreamCut("the stream ended before its stop reason")
        return message
    except Exception:
        if said:
            live.abandon("the provider's stream was cut; the call is made again")
        raise


def _index_of(events: Any) -> int:
    """The index of the block an `input_json` event belongs to: the last one started."""
    content = events.current_message_snapshot.content
    return len(content) - 1


class AnthropicMessages:
    """One Anthropic model behind the kernel's `Model` interface."""

    def __init__(
        self, model: str, price: Price | None, *, route: Route = BUILT_IN_ROUTES[PROVIDER],
        spec: str | None = None,
    ) -> None:  # fmt: skip
        self.model, self.price, self.route = model, price, route
        self.spec = spec or f"{route.name}:{model}"

    def next(self, request: ModelRequest) -> ModelResponse:
        client = sdk_client(anthropic.Anthropic, self.route)
        messages, tools = request_messages(request), request_tools(request)

        def attempt(timeout_s: float) -> Any:
            asked: dict[str, Any] = {
                "model": self.model, "system": contract.SYSTEM, "messages": messages,
                "tools": tools, "tool_choice": {"type": "any"},
                "max_tokens": request.max_output_tokens, "timeout": timeout_s,
            }  # fmt: skip
            if not request.live.on:
                return client.messages.create(**asked)
            return streamed(client.messages.stream(**asked), request.live)

        classified = functools.partial(classify, route=self.route)
        message = with_retries(attempt, classified, timeout_s=request.timeout_s, spec=self.spec)
        return self.response(message)

    def response(self, message: Any) -> ModelResponse:
        tokens = usage_of(message)
        stop = message.stop_reason
        spent = sdk.spent(
            tokens, self.price, provider=self.route.name, model=message.model, finish=stop,
            spec=self.spec,
        )  # fmt: skip
        if stop == "refusal":
            raise ModelStop(
                Outcome.GUARDRAIL_STOP, "the model refused to continue (stop_reason refusal)",
                "provider.refusal", spent,
            )  # fmt: skip
        if stop == "model_context_window_exceeded":
            raise ModelStop(
                Outcome.ERROR, "the request filled the model's context window",
                "provider.context_length", spent,
            )  # fmt: skip
        if stop == "max_tokens":
            reply = contract.malformed(
                "the reply was cut at the output cap; reply with one short function call"
            )
            return replace(spent, reply=reply)
        blocks = message.content or []
        calls = [(b.name, b.input) for b in blocks if b.type == "tool_use"]
        text = " ".join(b.text for b in blocks if b.type == "text")
        return replace(spent, reply=contract.reply_from(calls, text))
