"""Ledgers, queues and the operator controls; health and readiness."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Annotated, Any

import msgspec
import redis
from fastapi import APIRouter, Path, Query, Request

from turnstile.jobs.job import JOB_NAME
from turnstile.jobs.versions import VERSION
from turnstile.worker.client._client import Client
from turnstile.worker.http.apikeys import ApiKey
from turnstile.worker.http.bodies import JsonRoute
from turnstile.worker.http.context import NAME, Api, Caller, Ctx, Operator, tenant_scope
from turnstile.worker.http.problems import Problem
from turnstile.worker.http.routes_runs import PROBLEMS
from turnstile.worker.http.schemas import CeilingBody, ControlBody, LedgerView
from turnstile.worker.ops import flags, queues, subjects
from turnstile.worker.ops import versions as job_versions
from turnstile.worker.ops.errors import ControlError, QueueBrokenError
from turnstile.worker.ops.flags import Flagged, Resumed
from turnstile.worker.ops.subjects import Subject
from turnstile.worker.store import controls

router = APIRouter(responses=PROBLEMS, route_class=JsonRoute)

QueuePath = Annotated[str, Path(pattern=NAME, description="The queue.")]
TenantPath = Annotated[str, Path(pattern=NAME, description="The tenant.")]


@router.get("/healthz", tags=["health"], responses={})
def healthz() -> dict[str, str]:
    """The process answers."""
    return {"status": "ok"}


@router.get("/readyz", tags=["health"])
def readyz(ctx: Ctx, request: Request) -> dict[str, str]:
    """The store answers: 503 when it does not. Anyone may ask, so the answer names no
    address; an operator key this server has verified lately gets the store's own error."""
    try:
        ctx.redis.ping()
    except redis.RedisError as exc:
        # Read by hand, not declared: the probe needs no key, and the document says so.
        scheme, _, secret = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and ctx.operator_seen(secret.strip()):
            detail = f"the store is unreachable: {exc}"
        else:
            detail = f"the store is unreachable ({type(exc).__name__})"
        raise Problem(503, "store_unavailable", detail, {"Retry-After": "1"}) from None
    return {"status": "ready"}


def _ledger(ctx: Ctx, tenant: str) -> LedgerView:
    dims = {d: msgspec.to_builtins(s) for d, s in ctx.client.ledger.read(tenant).items()}
    return LedgerView(tenant=tenant, dimensions=dims)


@router.get("/v1/ledger", response_model=LedgerView, tags=["ledger"])
def get_ledger(
    key: Caller, ctx: Ctx,
    tenant: Annotated[str | None, Query(pattern=NAME, description="Operators only.")] = None,
) -> LedgerView:  # fmt: skip
    """The tenant's ledger in its current period: ceiling, committed and reserved per
    dimension (cost in micro-dollars, tokens, steps, tool calls)."""
    return _ledger(ctx, tenant_scope(key, tenant))


@router.get("/v1/tenants", tags=["operators"])
def list_tenants(_: Operator, ctx: Ctx) -> dict[str, Any]:
    """Every tenant with runs: its ledger and ceilings, and whether it is paused."""
    out = []
    for tenant in subjects.tenants(ctx.client):
        paused, by = controls.tenant_flags(ctx.redis, tenant)[:2]
        view = _ledger(ctx, tenant).model_dump()
        out.append({**view, "paused": paused, "paused_by": by})
    return {"tenants": out}


@router.put(
    "/v1/tenants/{tenant}/ceilings/{dimension}", response_model=LedgerView, tags=["operators"]
)
def set_ceiling(
    tenant: TenantPath,
    dimension: Annotated[str, Path(pattern=r"^[a-z][a-z0-9_]{0,63}$")],
    body: CeilingBody,
    _: Operator,
    ctx: Ctx,
) -> LedgerView:
    """Set one of a tenant's ceilings (`turnstile ledger set`); the ledger as it stands after."""
    ctx.client.ledger.set_ceiling(
        tenant, dimension, body.value, hard=body.hard, period=body.period.value
    )
    return _ledger(ctx, tenant)


@router.get("/v1/queues", tags=["operators"])
def list_queues(_: Operator, ctx: Ctx) -> dict[str, Any]:
    """Every queue: depth on the broker, turns in flight, running and parked runs, flags."""
    return {"queues": [dataclasses.asdict(q) for q in queues.queues(ctx.client)]}


@router.get("/v1/queues/{queue}/backlog", tags=["operators"])
def queue_backlog(queue: QueuePath, _: Operator, ctx: Ctx) -> dict[str, Any]:
    """The queue's backlog, what an autoscaler scales on: steps waiting (in the tenants'
    pending lists and on the broker) and turns in flight, read without scanning the store.
    404 for a queue the store does not know (no run was ever submitted to it), 503 for a
    broken one (a key of another type where one of its lists is), saying what was refused."""
    try:
        return dataclasses.asdict(queues.backlog(ctx.client, queue))
    except ControlError as exc:
        raise Problem(404, "not_found", str(exc)) from None
    except QueueBrokenError as exc:
        raise Problem(503, "queue_broken", str(exc)) from None


JobPath = Annotated[str, Path(pattern=f"^{JOB_NAME.pattern}$", description="The job.")]
VersionPath = Annotated[str, Path(pattern=f"^{VERSION.pattern}$", description="The job's version.")]


@router.get("/v1/jobs/{job}/versions/{version}", tags=["operators"])
def job_version(job: JobPath, version: VersionPath, _: Operator, ctx: Ctx) -> dict[str, Any]:
    """One version of a job: its live runs (running, suspended, parked, waiting for a worker
    of it; `in_flight` counts them all) and the workers serving it. What an autoscaler of a
    Deployment of that version reads: nothing in flight, and its pods may go (docs/versions.md).
    A version nobody serves or runs is all zeros."""
    found = [v for v in job_versions.versions(ctx.client) if (v.job, v.version) == (job, version)]
    view = found[0] if found else job_versions.VersionView(job, version)
    return {**dataclasses.asdict(view), "in_flight": view.in_flight}


def _by(key: ApiKey, body: ControlBody | None) -> str:
    """Who acted, for the record: always the key's name, with the person it names if any."""
    return f"{key.name} ({body.by})" if body and body.by else key.name


Act = Callable[..., Flagged | Resumed]  # (client, subject, *, by) -> what the control did


def _drain(c: Client, subject: Subject, *, by: str) -> Flagged:
    return flags.drain(c, subject.name, by=by)


# The operator controls, in the order the API lists them: (what, verb, act, description).
CONTROLS: tuple[tuple[str, str, Act, str], ...] = (
    ("queue", "pause", flags.pause, "Pause a queue: its runs park at their next turn boundary."),
    ("queue", "drain", _drain,
     "Drain a queue: new submissions refused, turns in flight finish, runs park."),
    ("queue", "resume", flags.resume,
     "Clear a queue's pause and drain; its parked runs go back, each once."),
    ("tenant", "pause", flags.pause,
     "Pause a tenant: its runs on every queue park at their next turn boundary."),
    ("tenant", "resume", flags.resume,
     "Clear a tenant's pause; its parked runs go back, each once."),
)  # fmt: skip
SUBJECT_PATHS = {"queue": QueuePath, "tenant": TenantPath}


def _control(kind: str, act: Act) -> Callable[..., dict[str, Any]]:
    """The route of one control: an operator's key, the queue or tenant named in the path (a
    404 when the store knows none of that name) and a body that may name who asked; the
    answer is what the control did."""

    def route(
        key: ApiKey, ctx: Api, body: ControlBody | None = None, **named: str
    ) -> dict[str, Any]:
        subject = Subject(**named)
        try:
            subjects.check_known(ctx.client, subject)
        except ControlError as exc:
            raise Problem(404, "not_found", str(exc)) from None
        return dataclasses.asdict(act(ctx.client, subject, by=_by(key, body)))

    # FastAPI reads a route's parameters from its signature: the path's is named for `kind`.
    param = inspect.Parameter
    route.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [
            param(kind, param.POSITIONAL_OR_KEYWORD, annotation=SUBJECT_PATHS[kind]),
            param("key", param.POSITIONAL_OR_KEYWORD, annotation=Operator),
            param("ctx", param.POSITIONAL_OR_KEYWORD, annotation=Ctx),
            param("body", param.POSITIONAL_OR_KEYWORD, default=None,
                  annotation=ControlBody | None),
        ],
        return_annotation=dict[str, Any],
    )  # fmt: skip
    return route


for _kind, _verb, _act, _description in CONTROLS:
    router.add_api_route(
        f"/v1/{_kind}s/{{{_kind}}}/{_verb}", _control(_kind, _act), methods=["POST"],
        name=f"{_verb}_{_kind}", description=_description, tags=["operators"],
    )  # fmt: skip
