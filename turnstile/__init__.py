"""Turnstile's public API: define a job, register it, submit runs, wait for them.

    from turnstile import Job, ToolContext, ToolError, tool

Defining a job imports no Celery, connects to nothing and registers nothing: a job is found
by the worker through the `turnstile.jobs` entry-point group or `TURNSTILE_JOBS`. The client
(`connect_client`, `Client`, `Settings`) is imported on first use and builds no Celery app of
the caller's: it sends through a private producer.
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
    Permit,
    Severity,
    Verdict,
    render_view,
)
from turnstile.jobs.model import Model, ModelRequest, ModelResponse, Scripted
from turnstile.jobs.state import Call, RunState
from turnstile.jobs.tools import Tool, ToolContext, ToolError, ToolOutput

if TYPE_CHECKING:
    from turnstile.worker.client._client import (
        Client,
        DecisionRefusedError,
        InvalidEventIdError,
        RunEvent,
        RunNotFoundError,
        SubmissionError,
        WaitTimeoutError,
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
    "InvalidEventIdError",
    "Job",
    "JobDefinitionError",
    "KernelError",
    "Model",
    "ModelRequest",
    "ModelResponse",
    "ParamsError",
    "Permit",
    "Registry",
    "RunEvent",
    "RunNotFoundError",
    "RunState",
    "Scripted",
    "Settings",
    "Severity",
    "SubmissionError",
    "Tool",
    "ToolContext",
    "ToolError",
    "ToolOutput",
    "UnknownJobError",
    "Verdict",
    "WaitTimeoutError",
    "arguments_schema",
    "connect_client",
    "render_view",
    "tool",
]

_LAZY = {
    "Client": "turnstile.worker.client._client",
    "DecisionRefusedError": "turnstile.worker.client._client",
    "InvalidEventIdError": "turnstile.worker.client._client",
    "RunEvent": "turnstile.worker.client._client",
    "RunNotFoundError": "turnstile.worker.client._client",
    "SubmissionError": "turnstile.worker.client._client",
    "WaitTimeoutError": "turnstile.worker.client._client",
    "connect_client": "turnstile.worker.client._client",
    "Registry": "turnstile.worker.registry",
    "Settings": "turnstile.worker.settings",
}


def __getattr__(name: str) -> Any:
    """The client side is imported on first use, so defining a job stays light."""
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'turnstile' has no attribute {name!r}")
