"""Turnstile's public API: define a job, register it, submit runs.

    from turnstile import Job, ToolContext, tool

Defining a job imports no Celery, connects to nothing and registers nothing: a job is found
by the worker through the `turnstile.jobs` entry-point group or `TURNSTILE_JOBS`. The client
(`connect_client`, `Client`, `Settings`) is imported on first use and builds no Celery app of
the caller's: it sends through a private producer.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from jobs.budget import Budget
from jobs.declare import arguments_schema, tool
from jobs.errors import JobDefinitionError, KernelError, ParamsError, UnknownJobError
from jobs.job import GRANT_RULE, Example, Guard, Job, Permit, Severity, Verdict, render_view
from jobs.model import Model, ModelRequest, ModelResponse, Scripted
from jobs.state import Call, RunState
from jobs.tools import Tool, ToolContext, ToolOutput

if TYPE_CHECKING:
    from worker.api import Client, DecisionRefusedError, SubmissionError, connect_client
    from worker.registry import Registry
    from worker.settings import Settings

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
    "ModelRequest",
    "ModelResponse",
    "ParamsError",
    "Permit",
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
    "Client": "worker.api",
    "DecisionRefusedError": "worker.api",
    "SubmissionError": "worker.api",
    "connect_client": "worker.api",
    "Registry": "worker.registry",
    "Settings": "worker.settings",
}


def __getattr__(name: str) -> Any:
    """The client side is imported on first use, so defining a job stays light."""
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'turnstile' has no attribute {name!r}")
