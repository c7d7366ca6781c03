"""One exception tree: every error Turnstile raises on purpose is a TurnstileError, each kind
is answered over HTTP and on the command line as it was before the tree had one root."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI

import turnstile
from turnstile import (
    ControlError,
    DecisionError,
    DecisionRefusedError,
    DrainTimeoutError,
    InvalidNameError,
    JobDefinitionError,
    KernelError,
    LedgerConflict,
    LedgerError,
    LedgerInputError,
    LedgerProtocolError,
    LedgerUnavailable,
    LedgerUnknownReservation,
    ModelError,
    ModelStop,
    ModelTimeout,
    NotDurableError,
    ParamsError,
    ProviderConfigError,
    RecordedFailure,
    RunNotFoundError,
    StateFormatError,
    StoreUnavailable,
    StoreUnavailableError,
    SubmissionConflictError,
    SubmissionError,
    SubmissionNameError,
    TurnstileError,
    UnknownJobError,
)
from turnstile.jobs.outcomes import Outcome
from turnstile.worker.cli.common import one_line
from turnstile.worker.http import problems
from turnstile.worker.http.problems import answer_to
from turnstile.worker.ops.subjects import Subject
from turnstile.worker.runtime.holds import LedgerDown

ROOT = Path(__file__).parents[2]

# Every module of the code packages, in a process of its own (importing the worker's modules
# connects Celery signals): the exception classes each defines, with whether they are ours.
WALK = """
import importlib, inspect, json, pkgutil
import turnstile
from turnstile.errors import TurnstileError
found = {}
for info in pkgutil.walk_packages(turnstile.__path__, "turnstile."):
    if info.name.rsplit(".", 1)[-1] == "__main__":
        continue  # `python -m turnstile` runs the command
    module = importlib.import_module(info.name)
    for value in vars(module).values():
        if (inspect.isclass(value) and issubclass(value, BaseException)
                and value.__module__ == module.__name__):
            found[f"{module.__name__}.{value.__qualname__}"] = issubclass(value, TurnstileError)
print(json.dumps(found))
"""


def test_every_public_exception_is_a_turnstile_error() -> None:
    """Each exception class that `turnstile` exports, and each one any module of the code
    packages defines, subclasses TurnstileError."""
    exported = [getattr(turnstile, name) for name in turnstile.__all__]
    classes = [c for c in exported if isinstance(c, type) and issubclass(c, BaseException)]
    families = {TurnstileError, KernelError, ModelError, LedgerError, ProviderConfigError}
    families |= {StoreUnavailableError, SubmissionError, DecisionRefusedError, ControlError}
    assert families <= set(classes)
    assert [c.__name__ for c in classes if not issubclass(c, TurnstileError)] == []

    out = subprocess.run(
        [sys.executable, "-c", WALK], cwd=ROOT, capture_output=True, text=True, check=True
    )
    found: dict[str, bool] = json.loads(out.stdout)
    assert "turnstile.worker.http.problems.Problem" in found  # the walk reached worker/http
    assert "turnstile.ledger.errors.LedgerConflict" in found  # and the ledger
    assert sorted(name for name, ours in found.items() if not ours) == []


def test_the_families_group_what_a_caller_catches_together() -> None:
    """A store that is down is one type whichever store it is; a bad name is a submission
    error only when a submission met it; a conflict is a submission error; the kernel's,
    the ledger's and the model's errors stay apart from one another."""
    for down in (StoreUnavailable, NotDurableError, LedgerUnavailable, LedgerDown):
        assert issubclass(down, StoreUnavailableError)
    assert issubclass(SubmissionConflictError, SubmissionError)
    assert issubclass(SubmissionNameError, SubmissionError)
    assert issubclass(SubmissionNameError, InvalidNameError)
    assert not issubclass(InvalidNameError, SubmissionError)
    with pytest.raises(InvalidNameError) as bad:
        Subject(tenant="-acme")  # as pause, resume and drain take it
    assert not isinstance(bad.value, SubmissionError)
    for kind in (ModelTimeout, ModelStop, RecordedFailure):
        assert issubclass(kind, ModelError) and not issubclass(kind, KernelError)
    assert not issubclass(LedgerError, KernelError) and not issubclass(KernelError, LedgerError)
    assert issubclass(ProviderConfigError, ParamsError)
    assert issubclass(DrainTimeoutError, ControlError)


def _caused(error: Exception, cause: Exception) -> Exception:
    error.__cause__ = cause
    return error


def test_the_http_table_keeps_every_status_and_code() -> None:
    """Each kind is answered with the status and code it had when ten handlers answered
    them; one the table does not name is a bug (None: a 500)."""
    cases: list[tuple[Exception, tuple[int, str] | None]] = [
        (StoreUnavailable("x"), (503, "store_unavailable")),
        (NotDurableError("x"), (503, "store_unavailable")),
        (LedgerUnavailable("x"), (503, "store_unavailable")),
        (RunNotFoundError("x"), (404, "run_not_found")),
        (SubmissionConflictError("x"), (409, "run_id_conflict")),
        (SubmissionError("x"), (422, "invalid_submission")),
        (SubmissionNameError("x"), (422, "invalid_submission")),
        (_caused(SubmissionError("x"), UnknownJobError("y")), (422, "unknown_job")),
        (DecisionRefusedError("x"), (409, "decision_refused")),
        (ControlError("x"), (409, "control_refused")),
        (DrainTimeoutError("x"), (409, "control_refused")),
        (LedgerInputError("x"), (422, "invalid_request")),
        (LedgerConflict("x"), (409, "ledger_refused")),
        (LedgerUnknownReservation("x"), (409, "ledger_refused")),
        (LedgerProtocolError("x"), (409, "ledger_refused")),
        (UnknownJobError("x"), (422, "invalid_request")),
        (ParamsError("x"), (422, "invalid_request")),
        (ProviderConfigError("x"), (422, "invalid_request")),
        (StateFormatError("x"), (422, "invalid_request")),
        (DecisionError("x"), (422, "invalid_request")),
        (JobDefinitionError("x"), (422, "invalid_request")),
        (ModelTimeout(), None),
        (RecordedFailure("x"), None),
        (ModelStop(Outcome.TOOL_FAILURE, "x", "model"), None),
        (TurnstileError("x"), None),
        (RuntimeError("x"), None),
    ]
    assert [(type(exc).__name__, answer_to(exc)) for exc, _ in cases] == [
        (type(exc).__name__, want) for exc, want in cases
    ]


def test_one_handler_answers_every_error_of_ours() -> None:
    """Over HTTP an error of the table is its problem document, a Problem its own answer,
    and an error of ours that the table does not name a 500, as any bug."""
    app = FastAPI()
    problems.install(app)
    raised: dict[str, Exception] = {
        "/conflict": SubmissionConflictError("run id 'r1' is taken"),
        "/down": LedgerUnavailable("ledger store unavailable: gone"),
        "/problem": problems.Problem(429, "rate_limited", "slow down", {"Retry-After": "3"}),
        "/model": ModelTimeout(),
    }

    @app.get("/{name}")
    def fail(name: str) -> None:
        raise raised[f"/{name}"]

    async def call() -> dict[str, httpx.Response]:
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://api") as web:
            return {path: await web.get(path) for path in raised}

    replies = asyncio.run(call())
    answered = {p: (r.status_code, r.json()["code"]) for p, r in replies.items()}
    assert answered == {
        "/conflict": (409, "run_id_conflict"),
        "/down": (503, "store_unavailable"),
        "/problem": (429, "rate_limited"),
        "/model": (500, "internal"),
    }
    assert replies["/down"].headers["Retry-After"] == "1"
    assert replies["/problem"].headers["Retry-After"] == "3"
    assert replies["/conflict"].headers["content-type"] == "application/problem+json"


def test_the_command_line_shows_our_errors_as_their_message() -> None:
    """An error of any family is its own one line; a model's signal that escaped the kernel
    is shown as unexpected, as before it had a family."""
    assert one_line(LedgerConflict("id reused\nelsewhere")) == "id reused elsewhere"
    assert one_line(UnknownJobError("unknown job 'x'")) == "unknown job 'x'"
    assert one_line(SubmissionNameError("bad tenant")) == "bad tenant"
    assert one_line(ModelTimeout()) == "unexpected ModelTimeout:"
