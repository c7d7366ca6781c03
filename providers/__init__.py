"""Model adapters for real providers: network I/O, so the pure kernel never imports this.

A model is named by a string `provider:model`, e.g. `openai:gpt-4.1-mini` (OpenAI or any
OpenAI-compatible server), `anthropic:claude-sonnet-4-5`, or `local:llama3.1:8b` for a named
endpoint (see endpoints.py). Importing this package loads no SDK; `make` does, for the wire
format it is asked for. Every function takes the process's `ProviderConfig` (config.py), built
once at the edge from its Settings: nothing here reads the environment.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import msgspec

from turnstile.jobs.budget import Budget
from turnstile.jobs.model import Model, is_provider_model, spec_problem
from turnstile.providers import endpoints
from turnstile.providers.config import ProviderConfig
from turnstile.providers.endpoints import ENDPOINTS_ENV, Route
from turnstile.providers.errors import ProviderConfigError
from turnstile.providers.known import near_misses
from turnstile.providers.prices import PRICES_FILE_ENV, Price, price_of, priced_budget

if TYPE_CHECKING:
    from turnstile.jobs.job import Job

PROVIDERS = endpoints.BUILT_IN


def _route(spec: str, config: ProviderConfig) -> tuple[Route, str]:
    problem = spec_problem(spec)
    if problem is not None:
        raise ProviderConfigError(f"model {problem}")
    provider, _, model = spec.partition(":")
    found = endpoints.route(provider, config)
    if found is None:
        names = endpoints.names(config)
        configured = "" if config.endpoints.strip() else ", which is not set"
        close = difflib.get_close_matches(provider, names, n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]}:{model}?" if close else ""
        raise ProviderConfigError(
            f"unknown provider {provider!r} in model {spec!r}{hint} (a provider is one of "
            f"{', '.join(names)}; named endpoints come from {ENDPOINTS_ENV}{configured})"
        )
    return found, model


def parse(spec: str, config: ProviderConfig) -> tuple[str, str]:
    """(provider, model) of a model string, or a clear error: the provider is `openai`,
    `anthropic` or a named endpoint of the configuration."""
    found, model = _route(spec, config)
    return found.name, model


def check(spec: str, config: ProviderConfig, *, keys: bool = True) -> str:
    """A model string a run may be submitted with, or the one-line reason it may not: its
    provider is known here, it is not a typing slip from a known model (`openai:gpt-4.1-mnii`:
    refused naming the closest, see known.py), and (with `keys`) a named endpoint's key
    variable is set. (A built-in provider's key is the workers' concern: a run without it
    ends `error` naming the variable.) A job's default and fallback models are checked when
    it is registered, without `keys`."""
    found, model = _route(spec, config)
    if (found.prices.get(model) or price_of(spec, config)) is None:
        misses = near_misses(spec, config)
        if misses:
            raise ProviderConfigError(
                f"unknown model {spec!r}: did you mean {' or '.join(misses)}? (a model this "
                f"process does not know yet is added, with its price, to the file named in "
                f"{PRICES_FILE_ENV})"
            )
    if not keys:
        return spec
    if found.base_env is None and found.key_env and not found.key:
        raise ProviderConfigError(
            f"model {spec!r}: endpoint {found.name!r} takes its key from {found.key_env}, "
            "which is not set"
        )
    return spec


def model_price(spec: str, config: ProviderConfig) -> Price | None:
    """The model's price: its endpoint's, else the price table's (which may name
    `endpoint:model` too); None when neither has one."""
    found, model = _route(spec, config)
    return found.prices.get(model) or price_of(spec, config)


def make(spec: str, config: ProviderConfig) -> Model:
    """The adapter for a model string, its URL, key and price from the configuration."""
    found, model = _route(spec, config)
    price = found.prices.get(model) or price_of(spec, config)
    if found.format == "openai":
        from turnstile.providers.openai_chat import OpenAIChat  # noqa: PLC0415 - only the SDK asked for

        return OpenAIChat(model, price, route=found, spec=spec)
    from turnstile.providers.anthropic_messages import AnthropicMessages  # noqa: PLC0415

    return AnthropicMessages(model, price, route=found, spec=spec)


# A real model's request carries the tool definitions and the contract's text besides the view,
# about a thousand tokens a turn, so a job's default token ceiling (sized for its stand-in
# model) is raised to this for a provider model; the cost ceiling still caps the spend.
PROVIDER_DEFAULT_MAX_TOKENS = 40_000


def _specs(params: Mapping[str, Any], job: Job | None) -> list[str]:
    """The model strings a run may call: its model's and its fallback's."""
    if job is not None:
        found = [job.model_spec(params), job.fallback_spec(params)]
    else:
        found = [params.get("model"), params.get("fallback_model")]
    return [str(s) for s in found if is_provider_model(s)]


def _dearest(prices: list[Price | None]) -> Price | None:
    """A price at least as high as each of them, rate by rate: what a turn that may be
    answered by either model must reserve."""
    known = [p for p in prices if p is not None]
    if not known:
        return None
    return Price(
        input=max(p.input for p in known),
        output=max(p.output for p in known),
        cached_input=max(p.input if p.cached_input is None else p.cached_input for p in known),
        cache_write=max(p.input if p.cache_write is None else p.cache_write for p in known),
    )


def budget_for(
    params: Mapping[str, Any],
    budget: Budget,
    config: ProviderConfig,
    *,
    default: bool = False,
    job: Job | None = None,
) -> Budget:
    """The run's budget at its models' prices, when it runs on a provider model (its `model`
    parameter's, else the job's own): each turn's reservation is then its worst case at those
    prices, the dearer of its model's and its fallback's. `default` says the budget is the
    job's own, not one the caller chose. A model string that cannot be used here, or a named
    endpoint whose key is not set, is a ProviderConfigError."""
    specs = [check(spec, config) for spec in _specs(params, job)]
    if not specs:
        return budget
    if default and budget.max_tokens < PROVIDER_DEFAULT_MAX_TOKENS:
        budget = msgspec.structs.replace(budget, max_tokens=PROVIDER_DEFAULT_MAX_TOKENS)
    return priced_budget(budget, _dearest([model_price(spec, config) for spec in specs]))


def unpriced(
    params: Mapping[str, Any], config: ProviderConfig, job: Job | None = None
) -> str | None:
    """The first provider model the run may call that has no price."""
    specs = _specs(params, job)
    return next((spec for spec in specs if model_price(spec, config) is None), None)
