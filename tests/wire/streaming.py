"""A recorded reply as the provider streams it: the same body, cut into the chunks or events
the provider's streaming wire format sends (`stream: true`).

OpenAI (Chat Completions, server-sent `data:` lines, `[DONE]` last): a first chunk with the
role, each tool call's id and name, then its arguments a few characters a chunk, the finish
reason, and, when `stream_options.include_usage` asked, a last chunk with no choices and the
usage. Anthropic (Messages, named events): `message_start` with the input usage,
`content_block_start` / `_delta` (`text_delta`, `input_json_delta`) / `_stop` per block,
`message_delta` with the stop reason and the output usage, `message_stop`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

PIECE_CHARS = 8  # about two tokens a chunk, as providers send them


def pieces(text: str) -> Iterator[str]:
    for at in range(0, len(text), PIECE_CHARS):
        yield text[at : at + PIECE_CHARS]


def _sse(data: Any, event: str | None = None) -> bytes:
    head = f"event: {event}\n" if event else ""
    body = data if isinstance(data, str) else json.dumps(data)
    return f"{head}data: {body}\n\n".encode()


def openai_chunks(body: Mapping[str, Any], request: Mapping[str, Any]) -> list[bytes]:
    """The completion `body` as its stream's frames, for the `request` that asked for it."""
    head = {"id": body["id"], "object": "chat.completion.chunk", "created": body["created"],
            "model": body["model"]}  # fmt: skip

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
        return _sse({**head, "choices": [choice]})

    out = []
    choice = (body.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    out.append(chunk({"role": "assistant", "content": None if message.get("tool_calls") else ""}))
    for piece in pieces(message.get("content") or ""):
        out.append(chunk({"content": piece}))
    for piece in pieces(message.get("refusal") or ""):
        out.append(chunk({"refusal": piece}))
    for index, call in enumerate(message.get("tool_calls") or []):
        function = call["function"]
        first = {"index": index, "id": call["id"], "type": "function",
                 "function": {"name": function["name"], "arguments": ""}}  # fmt: skip
        out.append(chunk({"tool_calls": [first]}))
        for piece in pieces(function.get("arguments") or ""):
            out.append(chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]}))
    out.append(chunk({}, choice.get("finish_reason") or "stop"))
    if (request.get("stream_options") or {}).get("include_usage") and body.get("usage"):
        out.append(_sse({**head, "choices": [], "usage": body["usage"]}))
    out.append(_sse("[DONE]"))
    return out


def anthropic_events(body: Mapping[str, Any]) -> list[bytes]:
    """The message `body` as its stream's events."""
    usage = dict(body.get("usage") or {})
    start_usage = {**usage, "output_tokens": 1}
    message = {k: v for k, v in body.items() if k != "usage"}
    message.update(content=[], stop_reason=None, stop_sequence=None, usage=start_usage)
    out = [_sse({"type": "message_start", "message": message}, "message_start")]
    for index, block in enumerate(body.get("content") or []):
        if block["type"] == "text":
            start: dict[str, Any] = {"type": "text", "text": ""}
            deltas = [{"type": "text_delta", "text": p} for p in pieces(block["text"])]
        else:
            start = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
            deltas = [
                {"type": "input_json_delta", "partial_json": p}
                for p in pieces(json.dumps(block.get("input") or {}))
            ]
        out.append(_sse({"type": "content_block_start", "index": index, "content_block": start},
                        "content_block_start"))  # fmt: skip
        for delta in deltas:
            out.append(_sse({"type": "content_block_delta", "index": index, "delta": delta},
                            "content_block_delta"))  # fmt: skip
        out.append(_sse({"type": "content_block_stop", "index": index}, "content_block_stop"))
    ended: dict[str, Any] = {
        "stop_reason": body.get("stop_reason"),
        "stop_sequence": body.get("stop_sequence"),
    }
    out.append(_sse({"type": "message_delta", "delta": ended,
                     "usage": {"output_tokens": usage.get("output_tokens", 0)}},
                    "message_delta"))  # fmt: skip
    out.append(_sse({"type": "message_stop"}, "message_stop"))
    return out


def frames(path: str, exchange: Mapping[str, Any], request: Mapping[str, Any]) -> list[bytes]:
    """The exchange's 200 body as the frames of its format's stream (the path says which),
    changed as the exchange asks: `no_usage` leaves out OpenAI's usage chunk, `malformed`
    puts a frame that is not JSON half-way, `cut` keeps the first half (the server then closes
    mid-body)."""
    if path == "/v1/chat/completions":
        out = openai_chunks(exchange["body"], request)
        if exchange.get("no_usage"):
            out = [f for f in out if b'"choices": []' not in f]
    else:
        out = anthropic_events(exchange["body"])
    if exchange.get("malformed"):  # named for Anthropic, whose SDK skips an unnamed event
        out.insert(len(out) // 2, b"event: content_block_delta\ndata: {not json\n\n")
    if exchange.get("cut"):
        out = out[: len(out) // 2]
    return out
