"""Errors as problem documents (RFC 9457): `application/problem+json` with `type`, `title`,
`status`, `detail` (one line) and a stable `code`. A client's mistake is a 4xx, a store
outage a 503; nothing a client sends is answered with a 500.

Every error Turnstile raises on purpose is a `TurnstileError`, answered by one handler from
one table of classes (`ANSWERS`); an error of ours that the table does not name is a bug.
"""

from __future__ import annotations

import contextlib
from typing import Any

import redis
import structlog
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from turnstile.errors import (
    ConversationBusyError,
    DecisionRefusedError,
    InvalidNameError,
    QueueNotAllowedError,
    RunNotFoundError,
    StoreUnavailableError,
    SubmissionConflictError,
    SubmissionError,
    TurnstileError,
)
from turnstile.jobs.errors import KernelError, UnknownJobError
from turnstile.ledger.errors import LedgerError, LedgerInputError
from turnstile.worker.broker.amqp import BrokerError
from turnstile.worker.ops.errors import (
    ControlError,
    EvaluationNotFoundError,
    ForkRefusedError,
    QueueBrokenError,
)
from turnstile.worker.scheduling.ratelimits import RateLimitError
from turnstile.worker.store import values

log = structlog.get_logger("turnstile.api")
one_line = values.one_line  # a detail on one line, as the API and the console show it

MEDIA_TYPE = "application/problem+json"
TYPE_BASE = "https://turnstile.dev/problems/"

TITLES = {
    400: "Bad request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not found",
    405: "Method not allowed",
    409: "Conflict",
    413: "Content too large",
    415: "Unsupported media type",
    422: "Unprocessable content",
    429: "Too many requests",
    500: "Internal server error",
    503: "Service unavailable",
}


class Problem(TurnstileError):  # noqa: N818 - it is the answer, not a failure of ours
    """An answer that is not a success, raised from a route and rendered by the handler."""

    def __init__(
        self, status: int, code: str, detail: str, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(detail)
        self.status, self.code, self.detail, self.headers = status, code, detail, headers


def document(status: int, code: str, detail: str) -> dict[str, Any]:
    return {
        "type": TYPE_BASE + code,
        "title": TITLES.get(status, "Error"),
        "status": status,
        "detail": one_line(detail),
        "code": code,
    }


def response(
    status: int, code: str, detail: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    return JSONResponse(
        document(status, code, detail), status_code=status, media_type=MEDIA_TYPE, headers=headers
    )


# The answer to an error raised on purpose: the first class it is an instance of, so the more
# specific comes first. The store client's own errors are here too: a route that reads the
# store directly meets them as they are.
ANSWERS: tuple[tuple[type[Exception], int, str], ...] = (
    (StoreUnavailableError, 503, "store_unavailable"),
    (redis.ConnectionError, 503, "store_unavailable"),
    (redis.TimeoutError, 503, "store_unavailable"),
    (BrokerError, 503, "broker_unavailable"),  # a RabbitMQ broker's queue depth, unread
    (RunNotFoundError, 404, "run_not_found"),
    (EvaluationNotFoundError, 404, "evaluation_not_found"),
    (ConversationBusyError, 409, "conversation_busy"),  # the detail names the active run
    (SubmissionConflictError, 409, "run_id_conflict"),
    (ForkRefusedError, 422, "fork_refused"),  # a turn outside the run, a run in flight, ...
    (QueueNotAllowedError, 403, "queue_not_allowed"),
    (SubmissionError, 422, "invalid_submission"),  # "unknown_job" when that is the cause
    (DecisionRefusedError, 409, "decision_refused"),
    (ControlError, 409, "control_refused"),
    (QueueBrokenError, 503, "queue_broken"),  # a queue's backlog, its keys refused
    (InvalidNameError, 422, "invalid_request"),
    (LedgerInputError, 422, "invalid_request"),
    (LedgerError, 409, "ledger_refused"),
    (KernelError, 422, "invalid_request"),
    (RateLimitError, 422, "invalid_limit"),
)


def answer_to(exc: Exception) -> tuple[int, str] | None:
    """The status and code for an error of the table; None for any other (a bug)."""
    for kind, status, code in ANSWERS:
        if isinstance(exc, kind):
            if kind is SubmissionError and isinstance(exc.__cause__, UnknownJobError):
                return status, "unknown_job"
            return status, code
    return None


def _validation_detail(exc: RequestValidationError) -> tuple[int, str, str]:
    errors = list(exc.errors())
    first: dict[str, Any] = errors[0] if errors else {}
    if first.get("type") == "json_invalid":
        return 400, "malformed_json", f"the body is not valid JSON: {first.get('msg', '')}"
    where = ".".join(str(p) for p in first.get("loc", ()) if p != "body") or "body"
    if first.get("type") == "extra_forbidden":
        return 422, "unknown_field", f"unknown field {where!r}"
    if first.get("type") == "missing":
        return 422, "missing_field", f"{where} is required"
    if first.get("type") == "string_too_short" and first.get("ctx", {}).get("min_length") == 1:
        return 422, "invalid_request", f"{where} must not be empty"
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return 422, "invalid_request", f"{where}: {first.get('msg', 'invalid')}{more}"


async def _on_error(_: Request, exc: Exception) -> JSONResponse:
    if isinstance(exc, Problem):
        return response(exc.status, exc.code, exc.detail, exc.headers)
    found = answer_to(exc)
    if found is None:
        raise exc  # a bug: the server's handler of last resort answers 500 and logs it
    status, code = found
    if status == 503:
        return response(status, code, "the store is unreachable; try again", {"Retry-After": "1"})
    return response(status, code, str(exc))


async def _on_validation(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    return response(*_validation_detail(exc))


async def _on_http(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    codes = {404: "not_found", 405: "method_not_allowed"}
    detail = exc.detail if isinstance(exc.detail, str) else TITLES.get(exc.status_code, "error")
    headers = dict(exc.headers) if exc.headers else None
    return response(exc.status_code, codes.get(exc.status_code, "http_error"), detail, headers)


async def _on_unexpected(request: Request, exc: Exception) -> JSONResponse:
    """A bug: logged with its traceback on the server; the client gets one line."""
    # The answer must not depend on the log: a log stream that is gone (closed, full) costs
    # the record, not the client's one line.
    with contextlib.suppress(OSError, ValueError):
        log.error("unexpected_error", path=request.url.path, exc_info=exc)
    return response(500, "internal", "the server failed on this request; it is logged")


def install(app: FastAPI) -> None:
    app.add_exception_handler(Exception, _on_unexpected)
    app.add_exception_handler(RequestValidationError, _on_validation)
    app.add_exception_handler(StarletteHTTPException, _on_http)
    for kind in (TurnstileError, redis.ConnectionError, redis.TimeoutError):
        app.add_exception_handler(kind, _on_error)
