"""Turnstile's public API: define a job, register it, submit runs, wait for them.

    from turnstile import Job, ToolContext, ToolError, tool

Defining a job imports no Celery, connects to nothing and registers nothing: a job is found
by the worker through the `turnstile.jobs` entry-point group or `TURNSTILE_JOBS`. The client
(`connect_client`, `Client`, `Settings`; `fork_run` and its `Variant`) is imported on first
use and builds no Celery app of the caller's: it sends through a private producer.

Every error Turnstile raises on purpose is a `TurnstileError` (turnstile/errors.py); each
public kind is exported here: kernel, model, ledger, provider, store, submission, decision
and control errors. Model strings, named endpoints and adapters (`make`, `parse`) are in
`turnstile.models`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from turnstile.errors import (
    ConversationBusyError,
    DecisionRefusedError,
    InvalidEventIdError,
    InvalidNameError,
    QueueNotAllowedError,
    RunNotFoundError,
    StoreUnavailableError,
    SubmissionConflictError,
    SubmissionError,
    SubmissionNameError,
    TurnstileError,
    WaitTimeoutError,
)
from turnstile.jobs.budget import Budget
from turnstile.jobs.conversations import ConversationPolicy
from turnstile.jobs.declare import arguments_schema, tool
from turnstile.jobs.errors import (
    DecisionError,
    JobDefinitionError,
    KernelError,
    ParamsError,
    StateFormatError,
    UnknownJobError,
)
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
from turnstile.jobs.mcp import McpServer
from turnstile.jobs.model import (
    Model,
    ModelError,
    ModelRequest,
    ModelResponse,
    ModelStop,
    ModelTimeout,
    ModelUnavailable,
    RecordedFailure,
    Scripted,
)
from turnstile.jobs.state import Call, RunState
from turnstile.jobs.tools import Tool, ToolContext, ToolError, ToolOutput

if TYPE_CHECKING:
    from turnstile.ledger.errors import (
        LedgerConflict,
        LedgerError,
        LedgerInputError,
        LedgerProtocolError,
        LedgerUnavailable,
        LedgerUnknownReservation,
    )
    from turnstile.providers.errors import ProviderConfigError
    from turnstile.worker.client._client import Client, connect_client
    from turnstile.worker.client._reading import RunEvent
    from turnstile.worker.ops.errors import ControlError, DrainTimeoutError
    from turnstile.worker.ops.fork import Variant, fork_run
    from turnstile.worker.registry import Registry
    from turnstile.worker.settings import Settings
    from turnstile.worker.store.runs import NotDurableError, StoreUnavailable

__all__ = [
    "GRANT_RULE",
    "Budget",
    "Call",
    "Client",
    "ControlError",
    "ConversationBusyError",
    "ConversationPolicy",
    "DecisionError",
    "DecisionRefusedError",
    "DrainTimeoutError",
    "Example",
    "Guard",
    "InvalidEventIdError",
    "InvalidNameError",
    "Job",
    "JobDefinitionError",
    "KernelError",
    "LedgerConflict",
    "LedgerError",
    "LedgerInputError",
    "LedgerProtocolError",
    "LedgerUnavailable",
    "LedgerUnknownReservation",
    "McpServer",
    "Model",
    "ModelChoice",
    "ModelError",
    "ModelRequest",
    "ModelResponse",
    "ModelStop",
    "ModelTimeout",
    "ModelUnavailable",
    "NotDurableError",
    "ParamsError",
    "Permit",
    "ProviderConfigError",
    "QueueNotAllowedError",
    "RecordedFailure",
    "Registry",
    "RunEvent",
    "RunNotFoundError",
    "RunState",
    "Scripted",
    "Settings",
    "Severity",
    "StateFormatError",
    "StoreUnavailable",
    "StoreUnavailableError",
    "SubmissionConflictError",
    "SubmissionError",
    "SubmissionNameError",
    "Tool",
    "ToolContext",
    "ToolError",
    "ToolOutput",
    "TurnstileError",
    "UnknownJobError",
    "Variant",
    "Verdict",
    "WaitTimeoutError",
    "arguments_schema",
    "connect_client",
    "fork_run",
    "render_view",
    "tool",
]

_LEDGER_ERRORS = "turnstile.ledger.errors"
_LAZY = {
    "Client": "turnstile.worker.client._client",
    "RunEvent": "turnstile.worker.client._reading",
    "connect_client": "turnstile.worker.client._client",
    "fork_run": "turnstile.worker.ops.fork",
    "Variant": "turnstile.worker.ops.fork",
    "ControlError": "turnstile.worker.ops.errors",
    "DrainTimeoutError": "turnstile.worker.ops.errors",
    "LedgerConflict": _LEDGER_ERRORS,
    "LedgerError": _LEDGER_ERRORS,
    "LedgerInputError": _LEDGER_ERRORS,
    "LedgerProtocolError": _LEDGER_ERRORS,
    "LedgerUnavailable": _LEDGER_ERRORS,
    "LedgerUnknownReservation": _LEDGER_ERRORS,
    "NotDurableError": "turnstile.worker.store.runs",
    "ProviderConfigError": "turnstile.providers.errors",
    "Registry": "turnstile.worker.registry",
    "Settings": "turnstile.worker.settings",
    "StoreUnavailable": "turnstile.worker.store.runs",
}


def __getattr__(name: str) -> Any:
    """The client side, the ledger and the providers are imported on first use, so defining
    a job stays light."""
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'turnstile' has no attribute {name!r}")
