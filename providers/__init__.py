"""Model adapters for real providers: network I/O, so the pure kernel never imports this.

A model is named by a string `provider:model`, e.g. `openai:gpt-4.1-mini` (OpenAI or any
OpenAI-compatible server) or `anthropic:claude-sonnet-4-5`. Importing this package loads no
SDK; `make` does, for the provider it is asked for.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from turnstile.jobs.budget import Budget
from turnstile.jobs.model import Model, is_provider_model
from turnstile.providers.errors import ProviderConfigError
from turnstile.providers.prices import price_of, priced_budget

PROVIDERS = ("openai", "anthropic")


def parse(spec: str) -> tuple[str, str]:
    """(provider, model) of a model string, or a clear error."""
    provider, _, model = spec.partition(":")
    if provider not in PROVIDERS:
        raise ProviderConfigError(
            f"unknown provider {provider!r} in model {spec!r}; one of {', '.join(PROVIDERS)}"
        )
    if not model.strip() or len(model) > 200:
        raise ProviderConfigError(f"model {spec!r} names no model after {provider}:")
    return provider, model


def make(spec: str) -> Model:
    """The adapter for a model string."""
    provider, model = parse(spec)
    if provider == "openai":
        from turnstile.providers.openai_chat import OpenAIChat  # noqa: PLC0415 - only the SDK asked for

        return OpenAIChat(model, price_of(spec))
    from turnstile.providers.anthropic_messages import AnthropicMessages  # noqa: PLC0415

    return AnthropicMessages(model, price_of(spec))


# A real model's request carries the tool definitions and the contract's text besides the view,
# about a thousand tokens a turn, so a job's default token ceiling (sized for its stand-in
# model) is raised to this for a provider model; the cost ceiling still caps the spend.
PROVIDER_DEFAULT_MAX_TOKENS = 40_000


def budget_for(params: Mapping[str, Any], budget: Budget, *, default: bool = False) -> Budget:
    """The run's budget at its model's prices, when its `model` parameter names a provider
    model: each turn's reservation is then its worst case at those prices. `default` says the
    budget is the job's own, not one the caller chose."""
    spec = params.get("model")
    if not is_provider_model(spec):
        return budget
    parse(str(spec))
    if default and budget.max_tokens < PROVIDER_DEFAULT_MAX_TOKENS:
        budget = msgspec.structs.replace(budget, max_tokens=PROVIDER_DEFAULT_MAX_TOKENS)
    return priced_budget(budget, price_of(str(spec)))


def unpriced(params: Mapping[str, Any]) -> str | None:
    """The provider model the run names when the price table has no price for it."""
    spec = params.get("model")
    if is_provider_model(spec) and price_of(str(spec)) is None:
        return str(spec)
    return None
