"""Models for any job: model strings, adapters, the `Model` protocol and what an adapter raises.

    from turnstile.models import make, parse

A model string is `provider:model`: `openai:gpt-4.1-mini` (OpenAI, or the OpenAI-compatible
server in OPENAI_BASE_URL), `anthropic:claude-sonnet-4-6`, or `name:model` for a named endpoint
configured in TURNSTILE_MODEL_ENDPOINTS (a local vLLM or Ollama server beside a hosted API).
A job names its default model (`Job(model="openai:gpt-4.1-mini")`, a `Model`, or a factory of
one); a run's `model` parameter overrides it for any job, and `fallback_model` (the run's or
`Job(fallback_model=...)`) is asked when the first model stays unavailable past its retries.

A model of one's own implements `Model.next(request) -> ModelResponse`, and raises
`ModelTimeout` when its call outlived `request.timeout_s`, `ModelStop` when the provider's
answer ends the run, and `ModelUnavailable` when the provider kept failing in a way a retry
could fix (which lets a fallback answer).

Each function takes the `ProviderConfig` to route and price with: a worker's and a client's
come from their Settings (`Settings.providers`). Without one, the function reads the
environment at that call, as `Settings()` does: this module is the edge for a script of one's
own, and nothing inside Turnstile calls it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from turnstile.jobs.job import Job
from turnstile.jobs.model import (
    Model,
    ModelRequest,
    ModelResponse,
    ModelStop,
    ModelTimeout,
    ModelUnavailable,
    Scripted,
    ToolSpec,
    spec_problem,
)
from turnstile.providers import check as _check
from turnstile.providers import make as _make
from turnstile.providers import model_price as _model_price
from turnstile.providers import parse as _parse
from turnstile.providers.config import ProviderConfig
from turnstile.providers.endpoints import ENDPOINTS_ENV, Endpoint
from turnstile.providers.endpoints import endpoints as _endpoints
from turnstile.providers.errors import ProviderConfigError
from turnstile.providers.fallback import Fallback
from turnstile.providers.prices import PRICES_FILE_ENV, Price
from turnstile.providers.runs import model_for_run as _model_for_run

__all__ = [
    "ENDPOINTS_ENV",
    "PRICES_FILE_ENV",
    "Endpoint",
    "Fallback",
    "Model",
    "ModelRequest",
    "ModelResponse",
    "ModelStop",
    "ModelTimeout",
    "ModelUnavailable",
    "Price",
    "ProviderConfig",
    "ProviderConfigError",
    "Scripted",
    "ToolSpec",
    "check",
    "endpoints",
    "make",
    "model_for_run",
    "model_price",
    "parse",
    "spec_problem",
]


def _given(config: ProviderConfig | None) -> ProviderConfig:
    """The configuration given, else the environment's, read now as `Settings()` reads it."""
    if config is not None:
        return config
    from turnstile.worker.settings import Settings  # noqa: PLC0415 - only when none is given

    return Settings().providers


def parse(spec: str, config: ProviderConfig | None = None) -> tuple[str, str]:
    """(provider, model) of a model string, or a ProviderConfigError saying why not: the
    provider is `openai`, `anthropic` or a named endpoint of the configuration."""
    return _parse(spec, _given(config))


def check(spec: str, config: ProviderConfig | None = None, *, keys: bool = True) -> str:
    """The model string if a run may be submitted with it (a known provider, no typing slip
    from a known model, and with `keys` a named endpoint's key set), else a
    ProviderConfigError of one line."""
    return _check(spec, _given(config), keys=keys)


def make(spec: str, config: ProviderConfig | None = None) -> Model:
    """The adapter for a model string, routed and priced by the configuration."""
    return _make(spec, _given(config))


def model_price(spec: str, config: ProviderConfig | None = None) -> Price | None:
    """The model's price (its endpoint's, else the price table's); None when it has none."""
    return _model_price(spec, _given(config))


def endpoints(config: ProviderConfig | None = None) -> dict[str, Endpoint]:
    """The named endpoints of the configuration."""
    return _endpoints(_given(config))


def model_for_run(
    job: Job, params: Mapping[str, Any], config: ProviderConfig | None = None
) -> Model:
    """The run's model: its `model` parameter's model string, else the job's own model,
    behind its fallback when the run or the job names one."""
    return _model_for_run(job, params, _given(config))
