"""The public names are a promise: what `turnstile` and `turnstile.worker.client` export is
pinned here, so that adding or removing one is a deliberate change seen in review."""

from __future__ import annotations

import turnstile
from turnstile.worker import client

TURNSTILE = {
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
    "GRANT_RULE",
    "Guard",
    "InvalidEventIdError",
    "InvalidNameError",
    "QueueNotAllowedError",
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
}

CLIENT = {
    "Client",
    "ConversationBusyError",
    "DecisionRefusedError",
    "InvalidEventIdError",
    "InvalidNameError",
    "QueueNotAllowedError",
    "RunEvent",
    "RunNotFoundError",
    "Settings",
    "SubmissionConflictError",
    "SubmissionError",
    "SubmissionNameError",
    "Submitted",
    "WaitTimeoutError",
    "connect_client",
    "idempotent_run_id",
}


def test_turnstile_exports_exactly_its_public_names() -> None:
    """`from turnstile import *` gives these names, and each of them resolves."""
    assert set(turnstile.__all__) == TURNSTILE
    assert all(getattr(turnstile, name) is not None for name in TURNSTILE)


def test_the_client_package_exports_exactly_what_a_service_needs() -> None:
    """`turnstile.worker.client` gives these names, each the same object `turnstile` gives."""
    assert set(client.__all__) == CLIENT
    for name in CLIENT & TURNSTILE:
        assert getattr(client, name) is getattr(turnstile, name), name
