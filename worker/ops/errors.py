"""The operator library's errors: a command that does not apply, a drain that ran out of time.
Imports nothing of the library, so `turnstile` exports them without loading it."""

from __future__ import annotations

from turnstile.errors import SubmissionError, TurnstileError


class ControlError(TurnstileError):
    """An operator command that does not apply: an unknown queue or tenant, resuming what is
    not paused, a filter that names no status. Nothing was changed."""


class DrainTimeoutError(ControlError):
    """`drain --wait` ran out of time with turns of the queue still in flight."""


class QueueBrokenError(TurnstileError):
    """A queue whose keys the server refuses to read (a key of another type where one of its
    lists or sets should be): its figures cannot be given. The queue views show it broken."""


class ForkRefusedError(SubmissionError):
    """A fork or an evaluation that cannot start from the run asked for: a turn outside the
    run, a run still in flight, a recording removed by retention, a variant that cannot be
    built. Nothing was started."""


class EvaluationNotFoundError(ControlError):
    """No such evaluation (`turnstile eval show ID`, `GET /v1/evals/{id}`)."""
