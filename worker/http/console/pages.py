"""The console's routes: server-rendered pages over the operator library, the same calls the
JSON API's routes make (worker/ops), behind the same keys, logged in with a session cookie.

Every form post is checked against the session's CSRF token; every refusal is a page (or the
next page's message) saying why, with nothing changed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote, urlencode

import jinja2
import redis
import structlog
from fastapi import APIRouter, Depends, FastAPI, Form, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException

from turnstile.errors import DecisionRefusedError, RunNotFoundError, TurnstileError
from turnstile.jobs.outcomes import Outcome, Status
from turnstile.worker.http import apikeys, sse
from turnstile.worker.http.apikeys import ApiKey
from turnstile.worker.http.console import views
from turnstile.worker.http.console.session import (
    FLASH_COOKIE,
    LOGIN_COOKIE,
    LOGIN_FORM_S,
    SESSION_COOKIE,
    ConsoleError,
    LoginNeededError,
    Sessions,
    Viewer,
    check_csrf,
)
from turnstile.worker.http.console.settings import ConsoleSettings
from turnstile.worker.http.context import Api, run_tenant, tenant_scope
from turnstile.worker.http.problems import Problem, answer_to, one_line
from turnstile.worker.http.routes_ops import CONTROLS
from turnstile.worker.names import RUN_ID_PATTERN
from turnstile.worker.ops import decisions, subjects
from turnstile.worker.ops import views as run_views
from turnstile.worker.ops.errors import ControlError
from turnstile.worker.ops.subjects import Subject

log = structlog.get_logger("turnstile.console")

HERE = Path(__file__).parent
RUN_ID = re.compile(RUN_ID_PATTERN)
ACTIONS = {(kind, verb): act for kind, verb, act, _ in CONTROLS}
DESCRIPTIONS = {(kind, verb): text for kind, verb, _, text in CONTROLS}
# Event types the run page listens for on its live stream (an SSE event is named by its type).
LIVE_EVENTS = ("submitted", "turn", "suspended", "decision", "parked", "resumed",
               "cancel_requested", "finished", "error", "message")  # fmt: skip
# The security headers (CSP, nosniff, no framing, no-store) are the API app's, on every
# response of the console too: worker/http/headers.py.


@dataclasses.dataclass
class Console:
    api: Api
    settings: ConsoleSettings
    sessions: Sessions
    templates: jinja2.Environment


def _console(request: Request) -> Console:
    made: Console = request.app.state.console
    return made


def _base(request: Request) -> str:
    return str(request.scope.get("root_path", ""))


def seen(request: Request) -> Viewer:
    """The session's live key; LoginNeededError (a redirect to the login page) without one."""
    return _console(request).sessions.viewer(request.cookies.get(SESSION_COOKIE))


Seen = Annotated[Viewer, Depends(seen)]
Csrf = Annotated[str, Form(max_length=200)]
Person = Annotated[str, Form(max_length=128)]
Back = Annotated[str, Form(max_length=2000)]


def _opt(value: str | None) -> str | None:
    """A filter's value: an empty field of a form is no filter."""
    return value.strip() or None if value is not None else None


# -- rendering -------------------------------------------------------------------------------


def render(
    request: Request, template: str, code: int = 200, viewer: Viewer | None = None,
    **context: Any,
) -> HTMLResponse:  # fmt: skip
    con = _console(request)
    base = _base(request)
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
    con, base = _console(request), _base(request)
    response = RedirectResponse(f"{base}{to}", status_code=303)
    if flash is not None:
        response.set_cookie(
            FLASH_COOKIE, con.sessions.flash(*flash), max_age=120, path=base or "/",
            httponly=True, samesite="strict", secure=con.settings.secure_cookie,
        )  # fmt: skip
    return response


def _back(request: Request, back: str, default: str) -> str:
    """Where a form returns to: a page of the console only (no other site, no other host)."""
    base = _base(request)
    if back.startswith(f"{base}/") and not back.startswith("//") and "\\" not in back:
        return back[len(base) :]
    return default


def _who(key: ApiKey, person: str) -> str:
    """Who acted, for the record: the key's name, with the person who pressed if given."""
    person = one_line(person, 128).strip()
    return f"{key.name} ({person})" if person else key.name


def _listing_scope(viewer: Viewer, tenant: str | None) -> str | None:
    """The tenant a listing shows: an operator's choice (None: every tenant), else the key's."""
    if viewer.operator and tenant is None:
        return None
    return tenant_scope(viewer.key, tenant)


def _run_tenant(con: Console, viewer: Viewer, run_id: str) -> str:
    if not RUN_ID.fullmatch(run_id):
        raise RunNotFoundError(f"no run {run_id[:80]!r}")
    return run_tenant(con.api, viewer.key, run_id)


# -- logging in ------------------------------------------------------------------------------

router = APIRouter()


@router.get("/")
def home(request: Request) -> Response:
    return redirect(request, "/runs")


@router.get("/login")
def login_page(request: Request, next: str = "") -> Response:
    con = _console(request)
    cookie, token = con.sessions.login_token()
    response = render(request, "login.html", token=token, next=next, error=None)
    response.set_cookie(
        LOGIN_COOKIE, cookie, max_age=LOGIN_FORM_S, path=_base(request) or "/", httponly=True,
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
    con = _console(request)
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
            LOGIN_COOKIE, cookie, max_age=LOGIN_FORM_S, path=_base(request) or "/",
            httponly=True, samesite="strict", secure=con.settings.secure_cookie,
        )  # fmt: skip
        return refused
    value, _ = con.sessions.issue(found)
    scope = "every tenant" if found.operator else f"tenant {found.tenant}"
    response = redirect(
        request, _back(request, next, "/runs"), ("ok", f"logged in as {found.name} ({scope})")
    )
    response.set_cookie(
        SESSION_COOKIE, value, max_age=con.settings.session_s, path=_base(request) or "/",
        httponly=True, samesite="strict", secure=con.settings.secure_cookie,
    )  # fmt: skip
    response.delete_cookie(LOGIN_COOKIE, path=_base(request) or "/")
    return response


@router.post("/logout")
def logout(request: Request, viewer: Seen, csrf: Csrf = "") -> Response:
    """End the session on the server (its record deleted), and drop its cookie."""
    check_csrf(viewer, csrf)
    _console(request).sessions.end(viewer)
    response = redirect(request, "/login", ("ok", "logged out"))
    response.delete_cookie(SESSION_COOKIE, path=_base(request) or "/")
    return response


# -- runs ------------------------------------------------------------------------------------


@router.get("/runs")
def runs(
    request: Request, viewer: Seen, *,
    tenant: Annotated[str | None, Query(max_length=128)] = None,
    status: Annotated[str | None, Query(max_length=40)] = None,
    outcome: Annotated[str | None, Query(max_length=40)] = None,
    job: Annotated[str | None, Query(max_length=128)] = None,
    cursor: Annotated[str | None, Query(max_length=2200)] = None,
    partial: bool = False,
) -> Response:  # fmt: skip
    con = _console(request)
    tenant, status, outcome, job = _opt(tenant), _opt(status), _opt(outcome), _opt(job)
    scope = _listing_scope(viewer, tenant)
    page = views.runs_page(
        con.api.client, tenant=scope, status=status, outcome=outcome, job=job,
        cursor=_opt(cursor), limit=con.settings.rows,
    )  # fmt: skip
    filters = {"tenant": tenant or "", "status": status or "", "outcome": outcome or "",
               "job": job or ""}  # fmt: skip
    more = None
    if page.next_cursor:
        more = urlencode({**{k: v for k, v in filters.items() if v}, "cursor": page.next_cursor})
    context: dict[str, Any] = {
        "page": page, "filters": filters, "more": more,
        "statuses": [s.value for s in Status], "outcomes": [o.value for o in Outcome],
    }  # fmt: skip
    if partial:
        return render(request, "_runs_rows.html", viewer=viewer, **context)
    return render(request, "runs.html", viewer=viewer, **context)


@router.get("/runs/{run_id}")
def run(request: Request, run_id: str, viewer: Seen, partial: bool = False) -> Response:
    con = _console(request)
    tenant = _run_tenant(con, viewer, run_id)
    page = views.run_page(con.api.client, run_id, tenant)
    template = "_run_body.html" if partial else "run.html"
    return render(request, template, viewer=viewer, page=page, run_id=run_id,
                  live_events=LIVE_EVENTS, shown=views.shown, compact=views.compact)  # fmt: skip


@router.get("/runs/{run_id}/events")
def run_events(
    request: Request, run_id: str, viewer: Seen,
    after: Annotated[str | None, Query(max_length=45)] = None,
) -> Response:  # fmt: skip
    """The run's events live, as the API's SSE stream sends them, for the run page."""
    con = _console(request)
    tenant = _run_tenant(con, viewer, run_id)
    last = request.headers.get("last-event-id")
    start = sse.check_event_id(last) if last else sse.check_event_id(after)
    slot = con.api.slots.open(viewer.key.id)
    frames = sse.stream(con.api.streams, tenant, run_id, after=start,
                        block_ms=con.api.slots.block_ms, slot=slot)  # fmt: skip
    return StreamingResponse(
        frames, media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )  # fmt: skip


# -- decisions -------------------------------------------------------------------------------


def _held_digest(con: Console, run_id: str, tenant: str) -> str | None:
    pending = run_views.run_view(con.api.client, run_id, tenant).get("pending") or {}
    digest = pending.get("digest")
    return str(digest) if digest else None


ExtendNames = Annotated[list[str], Form(max_length=80)]
ExtendValues = Annotated[list[str], Form(max_length=40)]


def _extension(names: list[str], values: list[str]) -> dict[str, int] | None:
    """A budget hold's form: each new limit as its amount names it (None: the form held a
    call). A value that is not a whole number is refused, naming it; the kernel checks the
    rest (an unknown amount, a limit below the run's or with no room for the next turn)."""
    if not names:
        return None
    if len(names) != len(values) or len(names) > 16:
        raise DecisionRefusedError("the form's new limits do not match its amounts")
    out = {}
    for name, raw in zip(names, values, strict=True):
        value = raw.strip().replace(",", "").replace("_", "")
        if not value.isdigit():
            raise DecisionRefusedError(
                f"the new {one_line(name, 80)} limit must be a whole number, not {raw[:40]!r}"
            )
        out[name] = int(value)
    return out


@router.post("/runs/{run_id}/approve")
def approve(
    request: Request, run_id: str, viewer: Seen, *, csrf: Csrf = "",
    digest: Annotated[str, Form(max_length=128)] = "", person: Person = "", back: Back = "",
    extend_name: ExtendNames = [], extend_value: ExtendValues = [],  # noqa: B006 - not kept
) -> Response:  # fmt: skip
    """Approve exactly the decision the page showed (its digest): a stale page, or a second
    click after the first approval, is refused by the store's compare-and-set. A budget hold's
    form carries its new limits (`extend_name`, `extend_value`, one pair per amount)."""
    check_csrf(viewer, csrf)
    con = _console(request)
    tenant = _run_tenant(con, viewer, run_id)
    to = _back(request, back, f"/runs/{run_id}")
    by = _who(viewer.key, person)
    try:
        extend = _extension(extend_name, extend_value)
        state = decisions.approve(con.api.client, run_id, by=by, digest=digest,
                                  tenant=tenant, extend=extend)  # fmt: skip
    except DecisionRefusedError as exc:
        log.info("console_refused", action="approve", run_id=run_id, by=by, why=str(exc))
        said = "not extended" if extend_name else "not approved"
        return redirect(request, to, ("error", f"{said}: {exc}; nothing was changed"))
    log.info("console_decided", action="approve", run_id=run_id, tenant=tenant, by=by)
    limits = state.decisions[-1].limits
    if limits:
        shown = " ".join(f"{k}={v}" for k, v in limits.items())
        return redirect(request, to, ("ok", f"extended run {run_id} to {shown} as {by}"))
    return redirect(request, to, ("ok", f"approved run {run_id} as {by}"))


@router.post("/runs/{run_id}/deny")
def deny(
    request: Request, run_id: str, viewer: Seen, *, csrf: Csrf = "",
    digest: Annotated[str, Form(max_length=128)] = "",
    reason: Annotated[str, Form(max_length=1000)] = "", person: Person = "", back: Back = "",
) -> Response:  # fmt: skip
    check_csrf(viewer, csrf)
    con = _console(request)
    tenant = _run_tenant(con, viewer, run_id)
    to = _back(request, back, f"/runs/{run_id}")
    if not reason.strip():
        return redirect(request, to, ("error", "not denied: give a reason; nothing was changed"))
    if digest and _held_digest(con, run_id, tenant) != digest:
        gone = f"not denied: run {run_id} no longer holds the decision this page showed"
        return redirect(request, to, ("error", f"{gone}; nothing was changed"))
    by = _who(viewer.key, person)
    try:
        decisions.deny(con.api.client, run_id, by=by, reason=reason.strip(), tenant=tenant)
    except DecisionRefusedError as exc:
        log.info("console_refused", action="deny", run_id=run_id, by=by, why=str(exc))
        return redirect(request, to, ("error", f"not denied: {exc}; nothing was changed"))
    log.info("console_decided", action="deny", run_id=run_id, tenant=tenant, by=by)
    return redirect(request, to, ("ok", f"denied run {run_id} as {by}"))


@router.get("/inbox")
def inbox(
    request: Request, viewer: Seen,
    tenant: Annotated[str | None, Query(max_length=128)] = None,
    cursor: Annotated[str | None, Query(max_length=2200)] = None,
) -> Response:  # fmt: skip
    con = _console(request)
    tenant = _opt(tenant)
    items, next_cursor = views.inbox(
        con.api.client, tenant=_listing_scope(viewer, tenant), cursor=_opt(cursor),
        limit=con.settings.inbox_rows,
    )  # fmt: skip
    more = urlencode({"tenant": tenant or "", "cursor": next_cursor}) if next_cursor else None
    return render(request, "inbox.html", viewer=viewer, items=items, tenant=tenant or "",
                  more=more, shown=views.shown)  # fmt: skip


# -- tenants and queues ----------------------------------------------------------------------


@router.get("/tenants")
def tenants(
    request: Request, viewer: Seen, tenant: Annotated[str | None, Query(max_length=128)] = None
) -> Response:
    con = _console(request)
    tenant = _opt(tenant)
    scope = _listing_scope(viewer, tenant)
    if scope is not None and scope != viewer.key.tenant:
        subjects.check_known(con.api.client, Subject(tenant=scope))
    shown = views.tenant_views(con.api.client, scope)
    return render(request, "tenants.html", viewer=viewer, tenants=shown)


@router.get("/queues")
def queues(request: Request, viewer: Seen) -> Response:
    viewer.require_operator()
    return render(request, "queues.html", viewer=viewer,
                  queues=views.queue_views(_console(request).api.client))  # fmt: skip


def _control_of(kind: str, verb: str, name: str) -> Subject:
    if (kind, verb) not in ACTIONS:
        raise ControlError(f"no control {verb!r} of a {kind!r}")
    return Subject(**{kind: name})


@router.get("/confirm")
def confirm(
    request: Request, viewer: Seen,
    kind: Annotated[str, Query(max_length=10)], verb: Annotated[str, Query(max_length=10)],
    name: Annotated[str, Query(max_length=128)],
) -> Response:  # fmt: skip
    """The step that asks before a control acts: what it will do, to what, and a button."""
    viewer.require_operator()
    subject = _control_of(kind, verb, name)
    subjects.check_known(_console(request).api.client, subject)
    back = f"/{kind}s"
    return render(request, "confirm.html", viewer=viewer, kind=kind, verb=verb, name=name,
                  description=DESCRIPTIONS[kind, verb], back=back)  # fmt: skip


@router.post("/control")
def control(
    request: Request, viewer: Seen, *, csrf: Csrf = "",
    kind: Annotated[str, Form(max_length=10)] = "", verb: Annotated[str, Form(max_length=10)] = "",
    name: Annotated[str, Form(max_length=128)] = "", person: Person = "",
) -> Response:  # fmt: skip
    """Pause, drain or resume a queue, or pause or resume a tenant, as the API's control
    routes do (the same functions), recorded as the key's name and the person who pressed."""
    check_csrf(viewer, csrf)
    viewer.require_operator()
    con = _console(request)
    subject = _control_of(kind, verb, name)
    subjects.check_known(con.api.client, subject)
    by = _who(viewer.key, person)
    done = ACTIONS[kind, verb](con.api.client, subject, by=by)
    log.info("console_control", kind=kind, verb=verb, name=name, by=by)
    said = dataclasses.asdict(done)
    if said.get("already"):
        text = f"{kind} {name} was already {said['flag']} (by {said['by']} at {said['at']})"
    elif "cleared" in said:
        text = (f"{kind} {name} resumed by {by}: cleared {', '.join(said['cleared']) or 'nothing'}"
                f", {len(said['resumed'])} parked run(s) sent back")  # fmt: skip
    else:
        text = f"{kind} {name} {said['flag']} by {by}"
    return redirect(request, f"/{kind}s", ("ok", text))


# -- errors ----------------------------------------------------------------------------------


def _error_page(request: Request, status: int, message: str) -> Response:
    viewer = None
    with contextlib.suppress(TurnstileError, redis.RedisError):
        viewer = seen(request)
    return render(request, "error.html", status, viewer=viewer, status=status,
                  message=one_line(message, 500))  # fmt: skip


async def _on_error(request: Request, exc: Exception) -> Response:
    if isinstance(exc, LoginNeededError):
        target = request.url.path[len(_base(request)) :] or "/runs"
        if request.method == "GET" and target not in ("/login", "/"):
            query = f"?{request.url.query}" if request.url.query else ""
            to = f"/login?next={quote(_base(request) + target + query, safe='')}"
        else:
            to = "/login"
        response = redirect(request, to, ("error", str(exc)))
        response.delete_cookie(SESSION_COOKIE, path=_base(request) or "/")
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
    console.include_router(router)
    console.add_exception_handler(Exception, _on_unexpected)
    console.add_exception_handler(RequestValidationError, _on_validation)
    console.add_exception_handler(StarletteHTTPException, _on_http)
    for kind in (TurnstileError, redis.ConnectionError, redis.TimeoutError):
        console.add_exception_handler(kind, _on_error)
    return console
