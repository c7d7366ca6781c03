"""The console: an app of its own, mounted under /console by the API's app (`create`), with
its pages by group: logging in and out (here), runs and decisions (`runs.py`), tenants,
queues and their controls (`controls.py`); server-rendered over the operator library, the
same calls the JSON API's routes make (worker/ops), behind the same keys, logged in with a
session cookie.

Every form post is checked against the session's CSRF token; every refusal is a page (or the
next page's message) saying why, with nothing changed.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote

import jinja2
import redis
import structlog
from fastapi import APIRouter, FastAPI, Form, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException

from turnstile.errors import TurnstileError
from turnstile.worker.http import apikeys
from turnstile.worker.http.console import controls, evals, runs
from turnstile.worker.http.console.render import (
    Back,
    Console,
    Csrf,
    Seen,
    back_to,
    base_path,
    console_of,
    redirect,
    render,
    seen,
)
from turnstile.worker.http.console.session import (
    LOGIN_COOKIE,
    LOGIN_FORM_S,
    SESSION_COOKIE,
    ConsoleError,
    LoginNeededError,
    Sessions,
    check_csrf,
)
from turnstile.worker.http.console.settings import ConsoleSettings
from turnstile.worker.http.context import Api
from turnstile.worker.http.problems import Problem, answer_to, one_line

log = structlog.get_logger("turnstile.console")

HERE = Path(__file__).parent

# -- logging in ------------------------------------------------------------------------------

router = APIRouter()


@router.get("/")
def home(request: Request) -> Response:
    return redirect(request, "/runs")


@router.get("/login")
def login_page(request: Request, next: str = "") -> Response:
    con = console_of(request)
    cookie, token = con.sessions.login_token()
    response = render(request, "login.html", token=token, next=next, error=None)
    response.set_cookie(
        LOGIN_COOKIE, cookie, max_age=LOGIN_FORM_S, path=base_path(request) or "/", httponly=True,
        samesite="strict", secure=con.settings.secure_cookie,
    )  # fmt: skip
    return response


@router.post("/login")
def login(
    request: Request,
    key: Annotated[str, Form(max_length=200)] = "",
    csrf: Csrf = "",
    next: Back = "",
) -> Response:
    con = console_of(request)
    con.sessions.check_login_token(request.cookies.get(LOGIN_COOKIE), csrf)
    found = apikeys.verify(con.api.redis, key.strip())
    if found is None:
        cookie, token = con.sessions.login_token()
        message = (
            "that is not a live API key (unknown, revoked or mistyped): nothing was done"
            if key.strip()
            else "enter an API key"
        )
        refused = render(request, "login.html", 401, token=token, next=next, error=message)
        refused.set_cookie(
            LOGIN_COOKIE, cookie, max_age=LOGIN_FORM_S, path=base_path(request) or "/",
            httponly=True, samesite="strict", secure=con.settings.secure_cookie,
        )  # fmt: skip
        return refused
    value, _ = con.sessions.issue(found)
    scope = "every tenant" if found.operator else f"tenant {found.tenant}"
    response = redirect(
        request, back_to(request, next, "/runs"), ("ok", f"logged in as {found.name} ({scope})")
    )
    response.set_cookie(
        SESSION_COOKIE, value, max_age=con.settings.session_s, path=base_path(request) or "/",
        httponly=True, samesite="strict", secure=con.settings.secure_cookie,
    )  # fmt: skip
    response.delete_cookie(LOGIN_COOKIE, path=base_path(request) or "/")
    return response


@router.post("/logout")
def logout(request: Request, viewer: Seen, csrf: Csrf = "") -> Response:
    """End the session on the server (its record deleted), and drop its cookie."""
    check_csrf(viewer, csrf)
    console_of(request).sessions.end(viewer)
    response = redirect(request, "/login", ("ok", "logged out"))
    response.delete_cookie(SESSION_COOKIE, path=base_path(request) or "/")
    return response


# -- errors ----------------------------------------------------------------------------------


def _error_page(request: Request, status: int, message: str) -> Response:
    viewer = None
    with contextlib.suppress(TurnstileError, redis.RedisError):
        viewer = seen(request)
    return render(request, "error.html", status, viewer=viewer, status=status,
                  message=one_line(message, 500))  # fmt: skip


async def _on_error(request: Request, exc: Exception) -> Response:
    if isinstance(exc, LoginNeededError):
        target = request.url.path[len(base_path(request)) :] or "/runs"
        if request.method == "GET" and target not in ("/login", "/"):
            query = f"?{request.url.query}" if request.url.query else ""
            to = f"/login?next={quote(base_path(request) + target + query, safe='')}"
        else:
            to = "/login"
        response = redirect(request, to, ("error", str(exc)))
        response.delete_cookie(SESSION_COOKIE, path=base_path(request) or "/")
        return response
    if isinstance(exc, ConsoleError):
        return _error_page(request, exc.status, str(exc))
    if isinstance(exc, Problem):
        return _error_page(request, exc.status, exc.detail)
    found = answer_to(exc)
    if found is None:
        return await _on_unexpected(request, exc)
    status, _ = found
    if status == 503:
        return _error_page(request, 503, "the store is unreachable; try again")
    return _error_page(request, status, str(exc))


async def _on_validation(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    first: dict[str, Any] = next(iter(exc.errors()), {})
    where = ".".join(str(p) for p in first.get("loc", ()) if p not in ("body", "query"))
    return _error_page(request, 400, f"{where or 'the request'}: {first.get('msg', 'invalid')}")


async def _on_http(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    messages = {404: "no such page in the console", 405: "this page does not take that method"}
    return _error_page(request, exc.status_code, messages.get(exc.status_code, str(exc.detail)))


async def _on_unexpected(request: Request, exc: Exception) -> Response:
    log.error("console_unexpected_error", path=request.url.path, exc_info=exc)
    return HTMLResponse("<!doctype html><title>Error</title><p>The console failed on this "
                        "request; it is logged.</p>", status_code=500)  # fmt: skip


def templates() -> jinja2.Environment:
    """The pages' templates: every value escaped, an undefined name an error."""
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        autoescape=True, undefined=jinja2.StrictUndefined,
        trim_blocks=True, lstrip_blocks=True,
    )  # fmt: skip


def create(api: Api, settings: ConsoleSettings | None = None) -> FastAPI:
    """The console as an app of its own, mounted under /console by the API's app."""
    settings = settings or ConsoleSettings()
    console = FastAPI(openapi_url=None, docs_url=None, redoc_url=None, redirect_slashes=False)
    console.state.console = Console(api, settings, Sessions(api.redis, settings), templates())
    console.mount("/static", StaticFiles(directory=HERE / "static"), name="static")
    for pages in (
        router,
        runs.router,
        controls.router,
        evals.router,
    ):  # in the order they were written
        console.include_router(pages)
    console.add_exception_handler(Exception, _on_unexpected)
    console.add_exception_handler(RequestValidationError, _on_validation)
    console.add_exception_handler(StarletteHTTPException, _on_http)
    for kind in (TurnstileError, redis.ConnectionError, redis.TimeoutError):
        console.add_exception_handler(kind, _on_error)
    return console
