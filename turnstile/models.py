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
"""

from __future__ import annotations

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
from turnstile.providers import check, make, model_price, parse
from turnstile.providers.endpoints import ENDPOINTS_ENV, Endpoint, endpoints
from turnstile.providers.errors import ProviderConfigError
from turnstile.providers.fallback import Fallback
from turnstile.providers.prices import PRICES_FILE_ENV, Price
from turnstile.providers.runs import model_for_run

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
