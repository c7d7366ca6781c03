"""What every page of the console uses: the console's parts (on its app's state), the viewer
of a request (its session's live key), the forms' common fields, rendering a page and
redirecting with a message for the next one, and where a form may send the browser back to."""

from __future__ import annotations

import dataclasses
import re
from typing import Annotated, Any

import jinja2
from fastapi import Depends, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse

from turnstile.errors import RunNotFoundError
from turnstile.worker.http.apikeys import ApiKey
from turnstile.worker.http.console.session import FLASH_COOKIE, SESSION_COOKIE, Sessions, Viewer
from turnstile.worker.http.console.settings import ConsoleSettings
from turnstile.worker.http.context import Api, run_tenant, tenant_scope
from turnstile.worker.http.problems import one_line
from turnstile.worker.names import RUN_ID_PATTERN

RUN_ID = re.compile(RUN_ID_PATTERN)
# The security headers (CSP, nosniff, no framing, no-store) are the API app's, on every
# response of the console too: worker/http/headers.py.


@dataclasses.dataclass
class Console:
    api: Api
    settings: ConsoleSettings
    sessions: Sessions
    templates: jinja2.Environment


def console_of(request: Request) -> Console:
    made: Console = request.app.state.console
    return made


def base_path(request: Request) -> str:
    return str(request.scope.get("root_path", ""))


def seen(request: Request) -> Viewer:
    """The session's live key; LoginNeededError (a redirect to the login page) without one."""
    return console_of(request).sessions.viewer(request.cookies.get(SESSION_COOKIE))


Seen = Annotated[Viewer, Depends(seen)]
Csrf = Annotated[str, Form(max_length=200)]
Person = Annotated[str, Form(max_length=128)]
Back = Annotated[str, Form(max_length=2000)]


def opt(value: str | None) -> str | None:
    """A filter's value: an empty field of a form is no filter."""
    return value.strip() or None if value is not None else None


def render(
    request: Request, template: str, code: int = 200, viewer: Viewer | None = None,
    **context: Any,
) -> HTMLResponse:  # fmt: skip
    con = console_of(request)
    base = base_path(request)
    flash = con.sessions.read_flash(request.cookies.get(FLASH_COOKIE))
    page = con.templates.get_template(template).render(
        base=base, flash=flash, viewer=viewer, path=request.url.path,
        query=request.url.query, **context,
    )  # fmt: skip
    response = HTMLResponse(page, status_code=code)
    if flash is not None:
        response.delete_cookie(FLASH_COOKIE, path=base or "/")
    return response


def redirect(request: Request, to: str, flash: tuple[str, str] | None = None) -> RedirectResponse:
    """303 to a page of the console (`to` relative to its base), with a message for it."""
    con, base = console_of(request), base_path(request)
    response = RedirectResponse(f"{base}{to}", status_code=303)
    if flash is not None:
        response.set_cookie(
            FLASH_COOKIE, con.sessions.flash(*flash), max_age=120, path=base or "/",
            httponly=True, samesite="strict", secure=con.settings.secure_cookie,
        )  # fmt: skip
    return response


def back_to(request: Request, back: str, default: str) -> str:
    """Where a form returns to: a page of the console only (no other site, no other host)."""
    base = base_path(request)
    if back.startswith(f"{base}/") and not back.startswith("//") and "\\" not in back:
        return back[len(base) :]
    return default


def who(key: ApiKey, person: str) -> str:
    """Who acted, for the record: the key's name, with the person who pressed if given."""
    person = one_line(person, 128).strip()
    return f"{key.name} ({person})" if person else key.name


def listing_scope(viewer: Viewer, tenant: str | None) -> str | None:
    """The tenant a listing shows: an operator's choice (None: every tenant), else the key's."""
    if viewer.operator and tenant is None:
        return None
    return tenant_scope(viewer.key, tenant)


def run_tenant_of(con: Console, viewer: Viewer, run_id: str) -> str:
    if not RUN_ID.fullmatch(run_id):
        raise RunNotFoundError(f"no run {run_id[:80]!r}")
    return run_tenant(con.api, viewer.key, run_id)
