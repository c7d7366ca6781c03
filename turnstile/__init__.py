"""Turnstile's public API: define a job, register it, submit runs.

    from turnstile import Job, ToolContext, tool

Defining a job imports no Celery, connects to nothing and registers nothing: a job is found
by the worker through the `turnstile.jobs` entry-point group or `TURNSTILE_JOBS`. The client
(`connect_client`, `Client`, `Settings`) is imported on first use and builds no Celery app of
the caller's: it sends through a private producer. Model strings, named endpoints and
adapters (`make`, `parse`) are in `turnstile.models`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from turnstile.jobs.budget import Budget
from turnstile.jobs.declare import arguments_schema, tool
from turnstile.jobs.errors import JobDefinitionError, KernelError, ParamsError, UnknownJobError
from turnstile.jobs.job import (
    GRANT_RULE,
    Example,
    Guard,
    Job,
    ModelChoice,
    Permit,
    Severity,
    Verdict,
    render_view,
)
from turnstile.jobs.model import (
    Model,
    ModelRequest,
    ModelResponse,
    ModelStop,
    ModelTimeout,
    ModelUnavailable,
    Scripted,
)
from turnstile.jobs.state import Call, RunState
from turnstile.jobs.tools import Tool, ToolContext, ToolOutput

if TYPE_CHECKING:
    from turnstile.providers.errors import ProviderConfigError
    from turnstile.worker.client._client import (
        Client,
        DecisionRefusedError,
        SubmissionError,
        connect_client,
    )
    from turnstile.worker.registry import Registry
    from turnstile.worker.settings import Settings

__all__ = [
    "GRANT_RULE",
    "Budget",
    "Call",
    "Client",
    "DecisionRefusedError",
    "Example",
    "Guard",
    "Job",
    "JobDefinitionError",
    "KernelError",
    "Model",
    "ModelChoice",
    "ModelRequest",
    "ModelResponse",
    "ModelStop",
    "ModelTimeout",
    "ModelUnavailable",
    "ParamsError",
    "Permit",
    "ProviderConfigError",
    "Registry",
    "RunState",
    "Scripted",
    "Settings",
    "Severity",
    "SubmissionError",
    "Tool",
    "ToolContext",
    "ToolOutput",
    "UnknownJobError",
    "Verdict",
    "arguments_schema",
    "connect_client",
    "render_view",
    "tool",
]

_LAZY = {
    "Client": "turnstile.worker.client._client",
    "DecisionRefusedError": "turnstile.worker.client._client",
    "SubmissionError": "turnstile.worker.client._client",
    "connect_client": "turnstile.worker.client._client",
    "ProviderConfigError": "turnstile.providers.errors",
    "Registry": "turnstile.worker.registry",
    "Settings": "turnstile.worker.settings",
}


def __getattr__(name: str) -> Any:
    """The client side is imported on first use, so defining a job stays light."""
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'turnstile' has no attribute {name!r}")
