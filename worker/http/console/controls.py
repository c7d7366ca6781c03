"""The console's pages of tenants and queues, and their controls (pause, drain, resume): a
confirmation page first, then the same operator functions the JSON API's control routes call
(`routes_ops.CONTROLS`)."""

from __future__ import annotations

import dataclasses
from typing import Annotated

import structlog
from fastapi import APIRouter, Form, Query, Request
from fastapi.responses import Response

from turnstile.worker.http.console import views
from turnstile.worker.http.console.render import (
    Csrf,
    Person,
    Seen,
    console_of,
    listing_scope,
    opt,
    redirect,
    render,
    who,
)
from turnstile.worker.http.console.session import check_csrf
from turnstile.worker.http.routes_ops import CONTROLS
from turnstile.worker.ops import subjects
from turnstile.worker.ops.errors import ControlError
from turnstile.worker.ops.subjects import Subject

log = structlog.get_logger("turnstile.console")

ACTIONS = {(kind, verb): act for kind, verb, act, _ in CONTROLS}
DESCRIPTIONS = {(kind, verb): text for kind, verb, _, text in CONTROLS}

router = APIRouter()


@router.get("/tenants")
def tenants(
    request: Request, viewer: Seen, tenant: Annotated[str | None, Query(max_length=128)] = None
) -> Response:
    con = console_of(request)
    tenant = opt(tenant)
    scope = listing_scope(viewer, tenant)
    if scope is not None and scope != viewer.key.tenant:
        subjects.check_known(con.api.client, Subject(tenant=scope))
    shown = views.tenant_views(con.api.client, scope)
    return render(request, "tenants.html", viewer=viewer, tenants=shown)


@router.get("/queues")
def queues(request: Request, viewer: Seen) -> Response:
    viewer.require_operator()
    client = console_of(request).api.client
    return render(request, "queues.html", viewer=viewer, queues=views.queue_views(client),
                  versions=views.version_views(client))  # fmt: skip


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
    subjects.check_known(console_of(request).api.client, subject)
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
    con = console_of(request)
    subject = _control_of(kind, verb, name)
    subjects.check_known(con.api.client, subject)
    by = who(viewer.key, person)
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
