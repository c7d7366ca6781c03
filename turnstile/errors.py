"""The one exception tree of Turnstile: every error it raises on purpose is a `TurnstileError`.
A denial, a refusal or a budget stop is an outcome, never one of these.

This module imports nothing of ours, so that jobs/ and ledger/ root their families here
without depending on worker/. The families:

- kernel: `KernelError` and its kinds (turnstile/jobs/errors.py); a provider's configuration
  error is one of its `ParamsError`s (turnstile/providers/errors.py);
- model: `ModelError`, a model adapter's signal to the kernel (turnstile/jobs/model.py);
- ledger: `LedgerError` (turnstile/ledger/errors.py);
- the store is down: `StoreUnavailableError`, whichever store it is;
- what a service meets when it submits, reads or decides: the rest of this module;
- an operator command that does not apply: `ControlError` (turnstile/worker/ops/errors.py).

An error's message never shows a password: `redact` hides the one of every URL in it.
"""

import re

_PASSWORD = re.compile(r"(?P<head>[a-z][a-z0-9+.-]*://[^/@\s:]*:)[^@\s]*@", re.IGNORECASE)


def redact(text: str) -> str:
    """The text with the password of every URL in it replaced by ***."""
    return _PASSWORD.sub(r"\g<head>***@", text)


class TurnstileError(Exception):
    """Base of every error Turnstile raises on purpose."""


class StoreUnavailableError(TurnstileError):
    """A store did not answer: the run store (`StoreUnavailable`), the ledger
    (`LedgerUnavailable`) or the ledger as a step meets it (`LedgerDown`). Nothing is lost;
    trying again later is safe."""


class InvalidNameError(TurnstileError):
    """A tenant, user, queue or run id that cannot be a name: refused before any write."""


class SubmissionError(TurnstileError):
    """A submission refused before anything was written."""


class SubmissionNameError(SubmissionError, InvalidNameError):
    """A submission refused for a name that cannot be one: caught as either."""


class SubmissionConflictError(SubmissionError):
    """The run id is taken: by another tenant, or by a different submission."""


class QueueNotAllowedError(SubmissionError):
    """A submission to a queue its tenant may not submit to: one no worker serves, or one
    outside the operators' list for the deployment or the tenant. Nothing was written."""


class ConversationBusyError(SubmissionError):
    """A submission with the `reject` policy to a conversation that has an active run: refused,
    naming that run (`active_run`). Nothing was written."""

    def __init__(self, message: str, active_run: str) -> None:
        super().__init__(message)
        self.active_run = active_run


class RunNotFoundError(TurnstileError):
    """No such run, or not one the caller's tenant may see."""


class StoreMismatchError(TurnstileError):
    """The store's URL and its server disagree: a cluster URL (`redis+cluster://`) naming a
    single server, a single server's URL naming a cluster node, or a cluster with slots that
    no node serves. Nothing was written."""


class DecisionRefusedError(TurnstileError):
    """An approve, deny or cancel that does not apply to the run as it stands."""


class WaitTimeoutError(TurnstileError, TimeoutError):
    """`Client.wait` gave up: the run was still running (or parked) after `timeout_s`."""


class InvalidEventIdError(TurnstileError, ValueError):
    """An `after` that is not an event id (`1764547200000-0`, as `RunEvent.id` gives)."""
