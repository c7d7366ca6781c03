"""OpenAI Chat Completions with tool calling: OpenAI itself and every server that speaks its
wire format (vLLM, Ollama, llama.cpp, LiteLLM). For `openai:` the base URL and key come from
the SDK's own variables, OPENAI_BASE_URL and OPENAI_API_KEY; a named endpoint has its own.

Usage is the provider's: `prompt_tokens` counts all input, `cached_tokens` is part of it;
`completion_tokens` counts all output, `reasoning_tokens` is part of it.

The call goes through the SDK's client (its headers, auth, base URL and status errors, which
`classify` reads), but not through its per-call layers: the body is our plain dict encoded once
(`msgspec`), not walked by the SDK's `maybe_transform` against its typed parameters, and the
reply is decoded into the few fields read here (`Completion`), not built into its pydantic
models; together about half a call's CPU in the SDK. A 200 whose body is not a completion (not
JSON, or not its shape) fails the attempt as a reply cut in transit does: it is retried.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

import httpx2
import msgspec
import openai
import pydantic
from openai.types.chat import ChatCompletion

from turnstile.jobs.live import LiveSink
from turnstile.jobs.model import ModelRequest, ModelResponse, ModelStop
from turnstile.jobs.outcomes import Outcome
from turnstile.providers import contract, sdk
from turnstile.providers.endpoints import BUILT_IN_ROUTES, Route
from turnstile.providers.prices import Price, Tokens
from turnstile.providers.retry import Failure, StreamCut, one_line, retry_after_s, with_retries
from turnstile.providers.sdk import sdk_client

PROVIDER = "openai"


def _body_error(exc: openai.APIStatusError) -> tuple[str, str]:
    """(code, message) of an error body: {"error": {"message", "type", "code", ...}}."""
    body = exc.body if isinstance(exc.body, dict) else {}
    inner = body.get("error", body) if isinstance(body.get("error", body), dict) else body
    code = str(inner.get("code") or inner.get("type") or "")
    message = str(inner.get("message") or exc.message)
    return code, message[:200]


def classify(exc: Exception, route: Route = BUILT_IN_ROUTES[PROVIDER]) -> Failure | None:
    """What a failed attempt means for the run; `route` names the server in the reason. A
    stream cut mid-way is what a reply cut in transit is: retried."""
    if isinstance(exc, openai.APITimeoutError | httpx2.TimeoutException):
        return Failure("timeout", "the call timed out")
    if isinstance(exc, openai.APIConnectionError):
        return Failure("retry", f"{route.name} unreachable: {exc}")
    if isinstance(exc, StreamCut | httpx2.TransportError | json.JSONDecodeError):
        return Failure("retry", f"{route.name}'s stream was cut: {one_line(exc)}")
    if not isinstance(exc, openai.APIStatusError):
        if isinstance(exc, openai.APIError):  # an error event inside the stream
            return Failure("retry", f"{route.name}'s stream failed: {one_line(exc)}")
        return None
    return _status_failure(exc, route)


def _status_failure(exc: openai.APIStatusError, route: Route) -> Failure:
    code, message = _body_error(exc)
    status, name = exc.status_code, route.name
    wait = retry_after_s(exc.response.headers)
    if status == 429 and code != "insufficient_quota":
        asked = f" (asked to wait {wait:g} s)" if wait is not None else ""
        return Failure(
            "retry", f"rate limited by {name}{asked}: {message}", wait_s=wait, rate_limited=True
        )
    failure = Failure(
        "stop", f"{name} rejected the request ({status}): {message}", detail="provider.rejected"
    )
    if status in (401, 403):
        failure = Failure(
            "stop", f"{name} refused the key ({status}): {message}; check {route.key_env}",
            detail="provider.authentication",
        )  # fmt: skip
    elif status == 429:
        failure = Failure(
            "stop", f"{name} quota exhausted: {message}; check the plan and billing",
            detail="provider.quota",
        )  # fmt: skip
    elif status == 400 and code == "context_length_exceeded":
        failure = Failure(
            "stop", f"the request is longer than the model's context window: {message}",
            detail="provider.context_length",
        )  # fmt: skip
    elif status in (408, 409) or status >= 500:  # a 503 may say when to come back
        failure = Failure("retry", f"{name} failed ({status}): {message}", wait_s=wait)
    return failure


def request_messages(request: ModelRequest) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": contract.SYSTEM},
        {"role": "user", "content": request.view},
    ]
    past = contract.past_calls(request)
    if past:
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": c.id,
                        "type": "function",
                        "function": {"name": c.name, "arguments": json.dumps(c.arguments)},
                    }
                    for c in past
                ],
            }
        )
        messages.extend(
            {"role": "tool", "tool_call_id": c.id, "content": c.result_text} for c in past
        )
    return messages


def request_tools(request: ModelRequest) -> list[dict[str, Any]]:
    return [
        {
            "type": "function",
            "function": {
                "name": f.name,
                "description": f.description,
                "parameters": dict(f.parameters),
            },
        }
        for f in contract.functions(request.tools)
    ]


class _Function(msgspec.Struct):
    name: str | None = None
    arguments: str | None = None


class _ToolCall(msgspec.Struct):
    function: _Function | None = None  # None for a call of another type (a custom tool)


class _Message(msgspec.Struct):
    content: str | None = None
    refusal: str | None = None
    tool_calls: list[_ToolCall] | None = None


class _Choice(msgspec.Struct):
    message: _Message
    finish_reason: str | None = None


class _PromptDetails(msgspec.Struct):
    cached_tokens: int | None = None
    cache_write_tokens: int | None = None  # some compatible servers report writes


class _OutputDetails(msgspec.Struct):
    reasoning_tokens: int | None = None


class _Usage(msgspec.Struct):
    prompt_tokens: int
    completion_tokens: int
    prompt_tokens_details: _PromptDetails | None = None
    completion_tokens_details: _OutputDetails | None = None


class Completion(msgspec.Struct):
    """What this adapter reads of a chat completion; the rest of the body is skipped."""

    model: str | None = None
    choices: list[_Choice] = []
    usage: _Usage | None = None


_decoder = msgspec.json.Decoder(Completion)


def decoded(content: bytes) -> Completion:
    """A 200's body as a chat completion; one that is not is a reply cut in transit."""
    return sdk.decoded(_decoder, content, "a chat completion")


PATH = "/chat/completions"


def usage_of(completion: Any) -> Tokens | None:
    usage = completion.usage
    if usage is None:
        return None
    prompt = usage.prompt_tokens_details
    output = usage.completion_tokens_details
    return Tokens(
        input=usage.prompt_tokens,
        cached_input=(prompt.cached_tokens or 0) if prompt else 0,
        cache_write=(getattr(prompt, "cache_write_tokens", None) or 0) if prompt else 0,
        output=usage.completion_tokens,
        reasoning=(output.reasoning_tokens or 0) if output else 0,
    )


def streamed(lines: Iterable[str], live: LiveSink) -> ChatCompletion:
    """The completion a stream of server-sent chunks adds up to, its final answer's words said
    to `live` as they come. The lines are read to the end of the body, so the connection goes
    back to the pool; each chunk is read as JSON, not as the SDK's model, which costs a turn
    more than all the rest of its streaming. A stream that ends before its finish reason, says
    an error, or whose chunks do not add up to a completion, is cut (`StreamCut`): the words
    said are abandoned and the attempt fails as a reply cut in transit does. A finished stream
    without a usage chunk is a completion without usage, as a server that reports none gives."""
    added = _Added()
    try:
        for line in lines:
            if not line.startswith("data:"):
                continue  # an event name, a comment, the blank line between events
            data = line[5:].strip()
            if data == "[DONE]":
                continue  # read on to the end of the body: the connection is kept
            chunk = json.loads(data)
            if not isinstance(chunk, dict):
                raise StreamCut(f"a chunk that is not an object: {data[:100]}")
            if chunk.get("error"):
                raise StreamCut(f"the stream said an error: {str(chunk['error'])[:200]}")
            delta = added.add(chunk)
            if delta:
                live.text(delta)
        if added.finish is None:
            raise StreamCut("the stream ended before its finish reason")
        return added.completion()
    except Exception:
        if added.said:
            live.abandon("the provider's stream was cut; the call is made again")
        raise


class _Added:
    """A chat completion added up from its chunks (as JSON objects)."""

    def __init__(self) -> None:
        self.head: dict[str, Any] = {}
        self.content: list[str] = []
        self.refusal: list[str] = []
        self.calls: dict[int, dict[str, Any]] = {}
        self.answers: dict[int, contract.AnswerText] = {}
        self.finish: str | None = None
        self.usage: Any = None
        self.said = False

    def add(self, chunk: dict[str, Any]) -> str:
        """Take one chunk in; the final answer's new words, if it brought any."""
        if not self.head:
            self.head = {k: chunk.get(k) for k in ("id", "created", "model")}
        self.usage = chunk.get("usage") or self.usage
        said = []
        for choice in chunk.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            self.content.append(delta.get("content") or "")
            self.refusal.append(delta.get("refusal") or "")
            for part in delta.get("tool_calls") or []:
                index = int(part.get("index", 0))
                call = self.calls.setdefault(index, {"id": "", "name": "", "arguments": ""})
                call["id"] = part.get("id") or call["id"]
                function = part.get("function") or {}
                call["name"] += function.get("name") or ""
                call["arguments"] += function.get("arguments") or ""
                answer = self.answers.setdefault(index, contract.AnswerText())
                said.append(answer.feed(call["name"], call["arguments"]))
            self.finish = choice.get("finish_reason") or self.finish
        words = "".join(said)
        self.said = self.said or bool(words)
        return words

    def completion(self) -> ChatCompletion:
        calls = [
            {"id": c["id"], "type": "function",
             "function": {"name": c["name"], "arguments": c["arguments"]}}
            for _, c in sorted(self.calls.items())
        ]  # fmt: skip
        message = {
            "role": "assistant", "content": "".join(self.content) or None,
            "refusal": "".join(self.refusal) or None, "tool_calls": calls or None,
        }  # fmt: skip
        try:
            return ChatCompletion.model_validate({
                **self.head, "object": "chat.completion",
                "choices": [{"index": 0, "message": message, "finish_reason": self.finish}],
                "usage": self.usage,
            })  # fmt: skip
        except pydantic.ValidationError as exc:
            raise StreamCut(f"the stream's chunks are not a completion: {one_line(exc)}") from exc


class OpenAIChat:
    """One model of an OpenAI-compatible server, behind the kernel's `Model` interface."""

    def __init__(
        self, model: str, price: Price | None, *, route: Route = BUILT_IN_ROUTES[PROVIDER],
        spec: str | None = None,
    ) -> None:  # fmt: skip
        self.model, self.price, self.route = model, price, route
        self.spec = spec or f"{route.name}:{model}"

    def next(self, request: ModelRequest) -> ModelResponse:
        hint = " (any value for a local server)" if self.route.base_env else ""
        client = sdk_client(openai.OpenAI, self.route, hint=hint)
        messages, tools = request_messages(request), request_tools(request)

        asked: dict[str, Any] = {
            "model": self.model, "messages": messages, "tools": tools,
            "tool_choice": "required", "max_completion_tokens": request.max_output_tokens,
        }  # fmt: skip
        if request.live.on:
            asked.update(stream=True, stream_options={"include_usage": True})

        def attempt(timeout_s: float) -> Any:
            if not request.live.on:
                return decoded(sdk.post(client, PATH, asked, timeout_s, stream=False).content)
            reply = sdk.post(client, PATH, asked, timeout_s, stream=True)
            try:
                return streamed(reply.iter_lines(), request.live)
            finally:
                reply.close()

        classified = functools.partial(classify, route=self.route)
        completion = with_retries(attempt, classified, timeout_s=request.timeout_s, spec=self.spec)
        return self.response(completion)

    def response(self, completion: Any) -> ModelResponse:
        tokens = usage_of(completion)
        choice = completion.choices[0] if completion.choices else None
        finish = choice.finish_reason if choice else None
        spent = sdk.spent(
            tokens, self.price, provider=self.route.name, model=completion.model, finish=finish,
            spec=self.spec,
        )  # fmt: skip
        if choice is None:
            return replace(spent, reply=contract.malformed("the reply had no choices"))
        message = choice.message
        if message.refusal:
            raise ModelStop(
                Outcome.GUARDRAIL_STOP, f"the model refused: {message.refusal[:200]}",
                "provider.refusal", spent,
            )  # fmt: skip
        if finish == "content_filter":
            raise ModelStop(
                Outcome.GUARDRAIL_STOP, "the provider's content filter stopped the reply",
                "provider.content_filter", spent,
            )  # fmt: skip
        if finish == "length":
            reply = contract.malformed(
                "the reply was cut at the output cap; reply with one short function call"
            )
        else:
            calls = [
                (c.function.name, c.function.arguments)
                for c in message.tool_calls or []
                if getattr(c, "function", None) is not None
            ]
            reply = contract.reply_from(calls, message.content or "")
        return replace(spent, reply=reply)
