"""Anthropic Messages with `tool_use`. For `anthropic:` the base URL and key come from the
SDK's own variables, ANTHROPIC_BASE_URL and ANTHROPIC_API_KEY; a named endpoint has its own.

Usage is normalised: Anthropic's `input_tokens` leaves out the tokens read from the cache
(`cache_read_input_tokens`) and written to it (`cache_creation_input_tokens`), so all input is
their sum; `output_tokens` includes thinking, which `output_tokens_details` breaks out.

As openai_chat.py's, the call goes through the SDK's client (headers, auth, base URL, status
errors) with the body encoded once (`msgspec`), and the reply is decoded into the few fields read
here (`Reply`), not the SDK's pydantic models. A 200 whose body is not a message is retried as a
reply cut in transit.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

import anthropic
import httpx2
import msgspec
import pydantic

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


class _Block(msgspec.Struct):
    type: str
    name: str | None = None  # a tool_use block's
    input: Any = None
    text: str = ""  # a text block's


class _OutputDetails(msgspec.Struct):
    thinking_tokens: int | None = None


class _Usage(msgspec.Struct):
    input_tokens: int
    output_tokens: int
    cache_read_input_tokens: int | None = None
    cache_creation_input_tokens: int | None = None
    output_tokens_details: _OutputDetails | None = None


class Reply(msgspec.Struct):
    """What this adapter reads of a message; the rest of the body is skipped."""

    usage: _Usage
    model: str | None = None
    stop_reason: str | None = None
    content: list[_Block] = []


_decoder = msgspec.json.Decoder(Reply)


def decoded(content: bytes) -> Reply:
    """A 200's body as a message; one that is not is a reply cut in transit (`StreamCut`)."""
    return sdk.decoded(_decoder, content, "a message")


PATH = "/v1/messages"


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


def streamed(lines: Iterable[str], live: LiveSink) -> Any:
    """The message a stream of server-sent events adds up to, its final answer's words said to
    `live` as they come. Each event is read as JSON to the end of the body (the SDK's models per
    event cost a streamed call two thirds more CPU than an unstreamed one). A stream that ends
    before its stop reason, says an error, or whose events do not add up to a message, is cut
    (`StreamCut`): the words said are abandoned and the attempt fails as a reply cut in transit
    does. The usage is `message_start`'s, with `message_delta`'s over it."""
    added = _Added()
    try:
        for line in lines:
            if line.startswith("data:"):
                event = json.loads(line[5:])
                words = added.add(event if isinstance(event, dict) else {})
                if words:
                    live.text(words)
        return added.message()
    except Exception:
        if added.said:
            live.abandon("the provider's stream was cut; the call is made again")
        raise


class _Added:
    """A message added up from its events (as JSON objects)."""

    def __init__(self) -> None:
        self.message_: dict[str, Any] | None = None
        self.inputs: dict[int, str] = {}  # a tool_use block's input JSON as it streams in
        self.answers: dict[int, contract.AnswerText] = {}
        self.said = False

    def add(self, event: dict[str, Any]) -> str:
        """Take one event in; the final answer's new words, if it brought any."""
        kind = event.get("type")
        if kind == "error":
            raise StreamCut(f"the stream said an error: {str(event.get('error'))[:200]}")
        if kind == "message_start":
            self.message_ = dict(event["message"])
            self.message_["content"] = []
            return ""
        message = self.message_
        if message is None or kind not in _EVENTS:
            return ""  # a ping, or an event this adapter does not need
        index = int(event.get("index", 0))
        if kind == "content_block_start":
            message["content"].append(dict(event["content_block"]))
        elif kind == "content_block_delta":
            return self._delta(message["content"][index], index, event["delta"])
        elif kind == "content_block_stop":
            block = message["content"][index]
            if block.get("type") == "tool_use":
                block["input"] = json.loads(self.inputs.get(index) or "{}")
        else:  # message_delta
            message.update({k: v for k, v in (event.get("delta") or {}).items()})
            usage = {k: v for k, v in (event.get("usage") or {}).items() if v is not None}
            message["usage"] = {**(message.get("usage") or {}), **usage}
        return ""

    def _delta(self, block: dict[str, Any], index: int, delta: dict[str, Any]) -> str:
        if delta.get("type") == "text_delta":
            block["text"] = block.get("text", "") + delta.get("text", "")
            return ""
        if delta.get("type") != "input_json_delta":
            return ""
        self.inputs[index] = self.inputs.get(index, "") + delta.get("partial_json", "")
        answer = self.answers.setdefault(index, contract.AnswerText())
        words = answer.feed(block.get("name"), self.inputs[index])
        self.said = self.said or bool(words)
        return words

    def message(self) -> Any:
        if self.message_ is None or self.message_.get("stop_reason") is None:
            raise StreamCut("the stream ended before its stop reason")
        try:
            return anthropic.types.Message.model_validate(self.message_)
        except pydantic.ValidationError as exc:
            raise StreamCut(f"the stream's events are not a message: {one_line(exc)}") from exc


_EVENTS = ("content_block_start", "content_block_delta", "content_block_stop", "message_delta")


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

        asked: dict[str, Any] = {
            "model": self.model, "system": contract.SYSTEM, "messages": messages,
            "tools": tools, "tool_choice": {"type": "any"},
            "max_tokens": request.max_output_tokens,
        }  # fmt: skip
        if request.live.on:
            asked["stream"] = True

        def attempt(timeout_s: float) -> Any:
            if not request.live.on:
                return decoded(sdk.post(client, PATH, asked, timeout_s, stream=False).content)
            reply = sdk.post(client, PATH, asked, timeout_s, stream=True)
            try:
                return streamed(reply.iter_lines(), request.live)
            finally:
                reply.close()

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
