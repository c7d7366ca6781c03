"""What every adapter does alike: find its key, keep one SDK client per endpoint, and count a
reply's tokens and cost into the kernel's `ModelResponse`."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any, TypeVar

from turnstile.jobs.model import ModelResponse, ModelStop
from turnstile.jobs.outcomes import Outcome
from turnstile.providers.endpoints import Route
from turnstile.providers.prices import Price, Tokens, cost_microusd
from turnstile.providers.transport import http_client

Sdk = TypeVar("Sdk")


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
