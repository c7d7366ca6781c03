"""What every adapter does alike: find its key, keep one SDK client per endpoint, post a plain
body through it and read the reply into the adapter's own structs, and count a reply's tokens
and cost into the kernel's `ModelResponse`."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any, TypeVar

import httpx2
import msgspec

from turnstile.jobs.model import ModelResponse, ModelStop
from turnstile.jobs.outcomes import Outcome
from turnstile.providers.endpoints import Route
from turnstile.providers.prices import Price, Tokens, cost_microusd
from turnstile.providers.retry import StreamCut, one_line
from turnstile.providers.transport import http_client

Sdk = TypeVar("Sdk")
Reply = TypeVar("Reply")


# A server that takes no key still gets one: both SDKs refuse to start without.
NO_KEY = "no-key"


@functools.lru_cache(maxsize=16)
def _cached(make: Callable[..., Any], base_url: str | None, key: str, pid: int) -> Any:
    return make(api_key=key, base_url=base_url, max_retries=0, http_client=http_client())


def sdk_client(make: Callable[..., Sdk], route: Route, *, hint: str = "") -> Sdk:
    """One SDK client per endpoint and key in a process (the pid keeps a forked child from
    sharing its parent's connections), so turns reuse its connections, on a transport whose
    cost per request does not grow with them (transport.py). The deadline governs
    retries, so the SDK's own are off. No key is a named stop, not a traceback. The key and
    the URL are the route's, as the configuration it was routed with gave them."""
    key = route.key if route.key_env else NO_KEY
    if not key:
        where = route.name if route.base_env else f"endpoint {route.name}"
        raise ModelStop(
            Outcome.ERROR, f"no key for {where}: set {route.key_env}{hint}",
            "provider.authentication",
        )  # fmt: skip
    client: Sdk = _cached(make, route.url, key, os.getpid())
    return client


_encoder = msgspec.json.Encoder()


def post(client: Any, path: str, body: dict[str, Any], timeout_s: float, *, stream: bool) -> Any:
    """POST `path` through an SDK's client with `body` as it is, encoded once (no SDK request
    layers): an httpx response, read whole unless `stream` (then the caller closes it). A 4xx
    or 5xx raises the SDK's `APIStatusError` for it, its body read, as its `create` does."""
    return client.post(
        path, cast_to=httpx2.Response, content=_encoder.encode(body),
        options={"timeout": timeout_s}, stream=stream, stream_cls=None,
    )  # fmt: skip


def decoded(decoder: msgspec.json.Decoder[Reply], content: bytes, what: str) -> Reply:
    """A 200's body as `decoder` reads it (the adapter's own structs, the rest skipped); one
    that is not `what` is a reply cut in transit (`StreamCut`)."""
    try:
        return decoder.decode(content)
    except msgspec.DecodeError as exc:
        raise StreamCut(f"the reply is not {what}: {one_line(exc)}") from exc


def spent(
    tokens: Tokens | None, price: Price | None, *, provider: str, model: str | None,
    finish: str | None, spec: str | None = None,
) -> ModelResponse:  # fmt: skip
    """A reply's usage and cost, with no reply yet: the adapter adds the reply it parsed."""
    if tokens is None:
        return ModelResponse(
            None, provider=provider, model=model, finish_reason=finish, answered_by=spec
        )
    return ModelResponse(
        None,
        input_tokens=tokens.input,
        output_tokens=tokens.output,
        cached_input_tokens=tokens.cached_input,
        cache_write_tokens=tokens.cache_write,
        reasoning_tokens=tokens.reasoning,
        cost_microusd=cost_microusd(tokens, price) if price else 0,
        provider=provider,
        model=model,
        finish_reason=finish,
        answered_by=spec,
    )
