"""The console's pages of runs: the listing, a run (with its events live), the decisions on
a held run (approve, with new limits for a budget hold, and deny) and the inbox of what waits
for a person."""

from __future__ import annotations

from typing import Annotated, Any
from urllib.parse import urlencode

import structlog
from fastapi import APIRouter, Form, Query, Request
from fastapi.responses import Response, StreamingResponse

from turnstile.errors import DecisionRefusedError
from turnstile.jobs.outcomes import Outcome, Status
from turnstile.worker.http import sse
from turnstile.worker.http.console import views
from turnstile.worker.http.console.render import (
    Back,
    Console,
    Csrf,
    Person,
    Seen,
    back_to,
    console_of,
    listing_scope,
    opt,
    redirect,
    render,
    run_tenant_of,
    who,
)
from turnstile.worker.http.console.session import check_csrf
from turnstile.worker.http.problems import one_line
from turnstile.worker.ops import decisions
from turnstile.worker.ops import views as run_views

log = structlog.get_logger("turnstile.console")

# Event types the run page listens for on its live stream (an SSE event is named by its type).
LIVE_EVENTS = ("submitted", "turn", "suspended", "decision", "parked", "resumed",
               "cancel_requested", "finished", "error", "message")  # fmt: skip
# The run's live output (docs/live.md): the turn being written, its tools and their progress.
LIVE_OUTPUT = ("text", "tool_started", "tool_ended", "progress", "abandoned")

router = APIRouter()


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
    con = console_of(request)
    tenant, status, outcome, job = opt(tenant), opt(status), opt(outcome), opt(job)
    scope = listing_scope(viewer, tenant)
    page = views.runs_page(
        con.api.client, tenant=scope, status=status, outcome=outcome, job=job,
        cursor=opt(cursor), limit=con.settings.rows,
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
    con = console_of(request)
    tenant = run_tenant_of(con, viewer, run_id)
    page = views.run_page(con.api.client, run_id, tenant)
    template = "_run_body.html" if partial else "run.html"
    return render(request, template, viewer=viewer, page=page, run_id=run_id,
                  live_events=LIVE_EVENTS, live_output=LIVE_OUTPUT, shown=views.shown,
                  compact=views.compact)  # fmt: skip


@router.get("/runs/{run_id}/events")
def run_events(
    request: Request, run_id: str, viewer: Seen,
    after: Annotated[str | None, Query(max_length=90)] = None, live: bool = False,
) -> Response:  # fmt: skip
    """The run's events live, as the API's SSE stream sends them, for the run page; with
    `live`, its live output between them, as `?live=1` of the API's."""
    con = console_of(request)
    tenant = run_tenant_of(con, viewer, run_id)
    last = request.headers.get("last-event-id") or after
    slot = con.api.slots.open(viewer.key.id)
    block_ms = con.api.slots.block_ms
    if live:
        cursor = sse.check_cursor(last)
        frames = sse.live_stream(con.api.streams, tenant, run_id, after=cursor,
                                 block_ms=block_ms, slot=slot)  # fmt: skip
    else:
        frames = sse.stream(con.api.streams, tenant, run_id, after=sse.check_event_id(last),
                            block_ms=block_ms, slot=slot)  # fmt: skip
    return StreamingResponse(
        frames, media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )  # fmt: skip


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
    con = console_of(request)
    tenant = run_tenant_of(con, viewer, run_id)
    to = back_to(request, back, f"/runs/{run_id}")
    by = who(viewer.key, person)
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
    con = console_of(request)
    tenant = run_tenant_of(con, viewer, run_id)
    to = back_to(request, back, f"/runs/{run_id}")
    if not reason.strip():
        return redirect(request, to, ("error", "not denied: give a reason; nothing was changed"))
    if digest and _held_digest(con, run_id, tenant) != digest:
        gone = f"not denied: run {run_id} no longer holds the decision this page showed"
        return redirect(request, to, ("error", f"{gone}; nothing was changed"))
    by = who(viewer.key, person)
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
    con = console_of(request)
    tenant = opt(tenant)
    items, next_cursor = views.inbox(
        con.api.client, tenant=listing_scope(viewer, tenant), cursor=opt(cursor),
        limit=con.settings.inbox_rows,
    )  # fmt: skip
    more = urlencode({"tenant": tenant or "", "cursor": next_cursor}) if next_cursor else None
    return render(request, "inbox.html", viewer=viewer, items=items, tenant=tenant or "",
                  more=more, shown=views.shown)  # fmt: skip
