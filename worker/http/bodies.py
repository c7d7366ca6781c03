"""JSON request bodies, read by one rule on every route of the API that takes one.

A body must say it is JSON (`Content-Type: application/json`, or a `+json` type), else it is
refused with 415: a body without a Content-Type is not guessed at. It must be JSON as RFC 8259
defines it: `NaN`, `Infinity` and a number too large for a float (`1e400`, read as infinity)
are refused with 400, where Python's reader takes them and they would be stored as null. Both
are checked before the route, its key check included, reads anything, so nothing is written.

Every router of the API is made with `route_class=JsonRoute`, so a route added later reads its
body by the same rule (`tests/integration/test_http_isolation.py` holds that every route with a
body is one). The console's forms are not JSON, and keep FastAPI's own route.
"""

from __future__ import annotations

import email.message
import json
import math
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi import params as fastapi_params
from fastapi.routing import APIRoute

from turnstile.worker.http.problems import Problem

NOT_JSON = "the body is not valid JSON"
Handler = Callable[[Request], Coroutine[Any, Any, Response]]


def is_json_type(content_type: str | None) -> bool:
    """Whether a Content-Type names JSON: application/json or application/<anything>+json, with
    or without parameters (`; charset=utf-8`)."""
    if not content_type:
        return False
    message = email.message.Message()
    message["content-type"] = content_type
    subtype = message.get_content_subtype()
    return message.get_content_maintype() == "application" and (
        subtype == "json" or subtype.endswith("+json")
    )


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value (JSON has no NaN or Infinity)")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text[:40]} is too large for a JSON number")
    return value


def check_json(content_type: str | None, body: bytes) -> None:
    """Refuse a body that is not JSON by its type (415) or by its text (400)."""
    if not is_json_type(content_type):
        got = f"Content-Type {content_type[:80]!r}" if content_type else "no Content-Type"
        raise Problem(
            415, "unsupported_media_type",
            f"the body must be JSON sent with Content-Type: application/json ({got} was sent)",
        )  # fmt: skip
    try:
        json.loads(body, parse_constant=_no_constant, parse_float=_finite)
    except RecursionError:
        raise Problem(400, "malformed_json", f"{NOT_JSON}: nested too deep") from None
    except ValueError as exc:  # a JSONDecodeError, bad UTF-8, NaN, 1e400, an over-long int
        raise Problem(400, "malformed_json", f"{NOT_JSON}: {exc}") from None


class JsonRoute(APIRoute):
    """A route of the API: a JSON body (when the route takes one and one is sent) is checked by
    `check_json` before FastAPI reads it."""

    def get_route_handler(self) -> Handler:
        handle = super().get_route_handler()
        field = self.body_field
        if field is None or isinstance(field.field_info, fastapi_params.Form):
            return handle

        async def checked(request: Request) -> Response:
            body = await request.body()  # kept by the request: FastAPI reads it again from there
            if body:
                check_json(request.headers.get("content-type"), body)
            return await handle(request)

        return checked
