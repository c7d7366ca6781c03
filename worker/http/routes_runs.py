"""Runs: submit, read, list, follow their events, decide on them; and the tenant's memory."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Response
from fastapi.responses import StreamingResponse

from turnstile.errors import QueueNotAllowedError, SubmissionConflictError, SubmissionError
from turnstile.worker.client._client import idempotent_run_id
from turnstile.worker.http import listing, sse
from turnstile.worker.http.bodies import JsonRoute
from turnstile.worker.http.context import (
    NAME,
    Api,
    Caller,
    Ctx,
    RunIdPath,
    run_tenant,
    tenant_scope,
)
from turnstile.worker.http.problems import Problem
from turnstile.worker.http.schemas import (
    ApproveBody,
    CancelBody,
    Decided,
    DenyBody,
    MemoryBody,
    ProblemBody,
    RunPage,
    SubmitBody,
    Submitted,
)
from turnstile.worker.ops import decisions, views
from turnstile.worker.store import controls, fields, run_index
from turnstile.worker.store.live import Cursor

PROBLEMS: dict[int | str, dict[str, Any]] = {
    status: {"model": ProblemBody, "content": {"application/problem+json": {}}}
    for status in (400, 401, 403, 404, 409, 413, 415, 422, 429, 503)
}
router = APIRouter(responses=PROBLEMS, route_class=JsonRoute)
MEMORY_WRITES = "memory"  # memory writes are counted apart from submissions, with the same limit

IdempotencyKey = Annotated[
    str | None,
    Header(alias="Idempotency-Key", min_length=1, max_length=255,
           description="A retried submit with the same key returns the same run."),
]  # fmt: skip


RUN = "/v1/runs/{run_id}"
BODY_ID, PATH_ID = "$response.body#/run_id", "$request.path.run_id"


def _link(path: str, method: str, run_id: str) -> dict[str, Any]:
    """An OpenAPI link to one of a run's operations, by its path, passing the run's id."""
    ref = "#/paths/" + path.replace("~", "~0").replace("/", "~1") + "/" + method
    return {"operationRef": ref, "parameters": {"run_id": run_id}}


# What a client can do next with the run an answer names: schemathesis follows these links
# (submit -> read -> follow -> decide), so the fuzz reaches runs that exist.
SUBMIT_LINKS = {
    "GetRun": _link(RUN, "get", BODY_ID),
    "FollowRun": _link(f"{RUN}/events", "get", BODY_ID),
    "CancelRun": _link(f"{RUN}/cancel", "post", BODY_ID),
}
RUN_LINKS = {
    "FollowRun": _link(f"{RUN}/events", "get", PATH_ID),
    "ApproveRun": _link(f"{RUN}/approve", "post", PATH_ID),
    "DenyRun": _link(f"{RUN}/deny", "post", PATH_ID),
    "CancelRun": _link(f"{RUN}/cancel", "post", PATH_ID),
}
EVENTS_LINKS = {
    "ApproveRun": _link(f"{RUN}/approve", "post", PATH_ID),
    "CancelRun": _link(f"{RUN}/cancel", "post", PATH_ID),
}


def submitted_run_id(ctx: Api, tenant: str, run_id: str | None, key: str | None) -> str | None:
    """The run a submission names. Run ids are global: a tenant never picks one itself, so
    it can neither learn nor take another tenant's. `run_id` in the body is a key of the
    tenant's own, like Idempotency-Key (the run's id is derived from the tenant and the key),
    except that it names the tenant's own run of that very id when there is one (a run made
    before, or the id an earlier answer gave), so a retry finds its run either way."""
    if run_id is not None:
        if run_index.exists(ctx.redis, tenant, run_id):
            return run_id
        return idempotent_run_id(tenant, run_id)
    return None if key is None else idempotent_run_id(tenant, key)


@router.post(
    "/v1/runs", status_code=202, response_model=Submitted, tags=["runs"],
    responses={202: {"description": "Accepted: the run is stored.", "links": SUBMIT_LINKS}},
)  # fmt: skip
def submit_run(
    *, body: SubmitBody, key: Caller, ctx: Ctx, response: Response,
    idempotency_key: IdempotencyKey = None,
) -> Submitted:  # fmt: skip
    """Create a run for the key's tenant and enqueue its first step."""
    if body.run_id is not None and idempotency_key is not None:
        raise Problem(422, "invalid_request", "give an Idempotency-Key or a run_id, not both")
    ctx.limiter.take(key.id)
    run_id = submitted_run_id(ctx, key.tenant, body.run_id, idempotency_key)
    budget = body.budget.model_dump(exclude_none=True) if body.budget else None
    try:
        made = ctx.client.submit_run(
            key.tenant, body.user, body.job, body.goal, body.params,
            budget=budget, queue=body.queue, run_id=run_id, priority=body.priority,
            conversation=body.conversation, conversation_policy=body.conversation_policy,
        )  # fmt: skip
    except SubmissionConflictError:
        # Only the tenant's own run of that key can be in the way (see submitted_run_id).
        raise Problem(
            409, "run_id_conflict", f"run {run_id!r} was submitted before with another body"
        ) from None
    except QueueNotAllowedError:
        raise  # a 403 (problems.py), whether the queue drains or not
    except SubmissionError as exc:
        # The client refuses a draining queue too; looked up only then, so it is a 409.
        if controls.queue_draining(ctx.redis, body.queue):
            raise Problem(409, "queue_draining", str(exc)) from None
        raise
    response.headers["Location"] = f"/v1/runs/{made.run_id}"
    # A new run is running (or waiting, in a conversation); a repeated submission, or a merge,
    # names a run that may have moved on since.
    fresh = made.created and made.conversation_action in ("", "started")
    status = None if fresh else run_index.fields_of(ctx.redis, key.tenant, made.run_id,
                                                    fields.STATUS)[0]  # fmt: skip
    return Submitted(
        run_id=made.run_id, tenant=key.tenant, status=str(status or "running"),
        created=made.created, sent=made.sent, url=f"/v1/runs/{made.run_id}",
        events_url=f"/v1/runs/{made.run_id}/events",
        conversation_action=made.conversation_action or None, active_run=made.active_run,
    )  # fmt: skip


@router.get(
    "/v1/runs/{run_id}", tags=["runs"],
    responses={200: {"description": "The run.", "links": RUN_LINKS}},
)  # fmt: skip
def get_run(run_id: RunIdPath, key: Caller, ctx: Ctx) -> dict[str, Any]:
    """The run: status, outcome, usage against budget, plan, the held call and its digest."""
    tenant = run_tenant(ctx, key, run_id)
    return views.run_view(ctx.client, run_id, tenant)


@router.get("/v1/runs", response_model=RunPage, tags=["runs"])
def list_runs(
    *, key: Caller, ctx: Ctx,
    status: Annotated[str | None, Query(max_length=40)] = None,
    outcome: Annotated[str | None, Query(max_length=40)] = None,
    cursor: Annotated[str | None, Query(max_length=2200)] = None,
    limit: Annotated[int | None, Query(ge=1, le=1000)] = None,
    tenant: Annotated[str | None, Query(max_length=128, description="Operators only.")] = None,
) -> RunPage:  # fmt: skip
    """A page of the tenant's runs, newest first, by status or outcome or all of them."""
    scope = tenant_scope(key, tenant)
    got = listing.page(ctx.client, scope, status=status, outcome=outcome, cursor=cursor,
                       limit=limit or ctx.settings.page_limit)  # fmt: skip
    return RunPage(runs=got.rows, next_cursor=got.next_cursor)


LIVE_QUERY = (
    "Also the run's live output between its events: the answer's words as the model writes"
    " them, tool calls starting and ending, their progress notes, an attempt abandoned. Each"
    " frame's id is then `<event id>/<live id>`, resumable with Last-Event-ID."
)


@router.get(
    "/v1/runs/{run_id}/events", tags=["runs"],
    response_class=StreamingResponse,
    responses={200: {"content": {"text/event-stream": {}},
                     "description": "The run's events as Server-Sent Events.",
                     "links": EVENTS_LINKS}},
)  # fmt: skip
def run_events(
    *, run_id: RunIdPath, key: Caller, ctx: Ctx,
    last_event_id: Annotated[str | None, Header(alias="Last-Event-ID", max_length=90)] = None,
    after: Annotated[str | None, Query(max_length=90, description="Same as Last-Event-ID.")] = None,
    live: Annotated[bool, Query(description=LIVE_QUERY)] = False,
) -> StreamingResponse:  # fmt: skip
    """The run's events in stored order, live, each `id:` its stream entry id; resumable with
    Last-Event-ID; the stream ends after the `finished` event. With `live=1`, the run's live
    output between them (docs/live.md)."""
    tenant = run_tenant(ctx, key, run_id)
    # Both are checked, though the header wins: a browser's EventSource reconnects to the same
    # URL (its ?after=) with the newest id it saw as Last-Event-ID.
    check = sse.check_cursor if live else sse.check_event_id
    resume_after = check(after)
    start = check(last_event_id) if last_event_id is not None else resume_after
    slot = ctx.slots.open(key.id)
    if isinstance(start, Cursor):
        frames = sse.live_stream(ctx.streams, tenant, run_id, after=start,
                                 block_ms=ctx.slots.block_ms, slot=slot)  # fmt: skip
    else:
        frames = sse.stream(ctx.streams, tenant, run_id, after=start,
                            block_ms=ctx.slots.block_ms, slot=slot)  # fmt: skip
    return StreamingResponse(
        frames, media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )  # fmt: skip


# -- decisions ------------------------------------------------------------------------------


def _decided(ctx: Ctx, tenant: str, run_id: str, result: str, by: str) -> Decided:
    stored = ctx.client.store.hash(tenant, run_id)
    return Decided(run_id=run_id, status=stored.get(fields.STATUS, ""),
                   outcome=stored.get(fields.OUTCOME, ""), result=result, by=by)  # fmt: skip


@router.post("/v1/runs/{run_id}/approve", response_model=Decided, tags=["decisions"])
def approve_run(run_id: RunIdPath, body: ApproveBody, key: Caller, ctx: Ctx) -> Decided:
    """Approve exactly the held call with this digest; the run goes on. For a run held
    `needs_budget`, approve an extension (`extend`: new limits; none: the suggested ones) of
    the hold with this digest; the run re-admits with them. Refused (409) if the run holds no
    call, another one, is not waiting for an extension, or the extension would pass a hard
    ceiling of the tenant's."""
    tenant = run_tenant(ctx, key, run_id)
    extend = None if body.extend is None else dict(body.extend)
    state = decisions.approve(
        ctx.client, run_id, by=key.name, digest=body.digest, tenant=tenant, extend=extend
    )
    result = "extended" if state.decisions[-1].kind == "extended" else "approved"
    return _decided(ctx, tenant, run_id, result, key.name)


@router.post("/v1/runs/{run_id}/deny", response_model=Decided, tags=["decisions"])
def deny_run(run_id: RunIdPath, body: DenyBody, key: Caller, ctx: Ctx) -> Decided:
    """Deny the held call: the run ends `approval_denied` (or its job shows the model why); a
    run held `needs_budget` ends `budget_exhausted`, naming the dimension."""
    tenant = run_tenant(ctx, key, run_id)
    decisions.deny(ctx.client, run_id, by=key.name, reason=body.reason, tenant=tenant)
    return _decided(ctx, tenant, run_id, "denied", key.name)


@router.post("/v1/runs/{run_id}/cancel", response_model=Decided, tags=["decisions"])
def cancel_run(run_id: RunIdPath, key: Caller, ctx: Ctx, body: CancelBody | None = None) -> Decided:
    """Cancel: at once if suspended or parked, else at the next turn boundary."""
    tenant = run_tenant(ctx, key, run_id)
    reason = (body or CancelBody()).reason
    result = decisions.cancel(ctx.client, run_id, by=key.name, reason=reason, tenant=tenant)
    return _decided(ctx, tenant, run_id, result, key.name)


# -- memory ---------------------------------------------------------------------------------

UserQuery = Annotated[str, Query(pattern=NAME, description="The end user whose notes.")]


@router.post("/v1/memory", status_code=201, tags=["memory"])
def add_note(body: MemoryBody, key: Caller, ctx: Ctx) -> dict[str, str]:
    """Remember a note for one of the tenant's users; recalled by that user's later runs."""
    ctx.limiter.take(key.id, MEMORY_WRITES)
    said = ctx.client.remember(key.tenant, body.user, body.text, source=body.source,
                               ttl_s=body.ttl_s)  # fmt: skip
    if said != "stored":
        raise Problem(422, "note_refused", said)
    return {"result": said}


@router.get("/v1/memory", tags=["memory"])
def list_notes(
    user: UserQuery, key: Caller, ctx: Ctx,
    tenant: Annotated[str | None, Query(pattern=NAME, description="Operators only.")] = None,
) -> dict[str, Any]:  # fmt: skip
    """The user's live notes, in this tenant (an operator's `tenant`, in that one)."""
    notes = ctx.client.notes(tenant_scope(key, tenant), user=user)
    return {"user": user, "notes": [{"text": n.text, "source": n.source,
            "created_s": n.created_s, "expires_s": n.expires_s} for n in notes]}  # fmt: skip


@router.delete("/v1/memory", tags=["memory"])
def forget_notes(user: UserQuery, key: Caller, ctx: Ctx) -> dict[str, int]:
    """Forget every note of the user, in this tenant."""
    ctx.limiter.take(key.id, MEMORY_WRITES)
    return {"forgotten": ctx.client.forget(key.tenant, user=user)}
