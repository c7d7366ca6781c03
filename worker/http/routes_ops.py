"""Ledgers, queues and the operator controls; health and readiness."""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any

import msgspec
import redis
from fastapi import APIRouter, Path, Query, Request

from turnstile.worker.http.context import NAME, Caller, Ctx, Operator, tenant_scope
from turnstile.worker.http.problems import Problem
from turnstile.worker.http.routes_runs import PROBLEMS
from turnstile.worker.http.schemas import CeilingBody, ControlBody, LedgerView
from turnstile.worker.ops import flags, queues, subjects
from turnstile.worker.ops.errors import ControlError
from turnstile.worker.ops.subjects import Subject
from turnstile.worker.store import keys

router = APIRouter(responses=PROBLEMS)

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
        paused, by = ctx.redis.hmget(keys.control(tenant), "paused", "paused_by")
        view = _ledger(ctx, tenant).model_dump()
        out.append({**view, "paused": paused or "", "paused_by": by or ""})
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


def _by(key: Operator, body: ControlBody | None) -> str:
    """Who acted, for the record: always the key's name, with the person it names if any."""
    return f"{key.name} ({body.by})" if body and body.by else key.name


@router.post("/v1/queues/{queue}/pause", tags=["operators"])
def pause_queue(
    queue: QueuePath, key: Operator, ctx: Ctx, body: ControlBody | None = None
) -> dict[str, Any]:
    """Pause a queue: its runs park at their next turn boundary."""
    return dataclasses.asdict(flags.pause(ctx.client, _known(ctx, queue=queue), by=_by(key, body)))


@router.post("/v1/queues/{queue}/drain", tags=["operators"])
def drain_queue(
    queue: QueuePath, key: Operator, ctx: Ctx, body: ControlBody | None = None
) -> dict[str, Any]:
    """Drain a queue: new submissions refused, turns in flight finish, runs park."""
    _known(ctx, queue=queue)
    return dataclasses.asdict(flags.drain(ctx.client, queue, by=_by(key, body)))


@router.post("/v1/queues/{queue}/resume", tags=["operators"])
def resume_queue(
    queue: QueuePath, key: Operator, ctx: Ctx, body: ControlBody | None = None
) -> dict[str, Any]:
    """Clear a queue's pause and drain; its parked runs go back, each once."""
    subject = _known(ctx, queue=queue)
    return dataclasses.asdict(flags.resume(ctx.client, subject, by=_by(key, body)))


@router.post("/v1/tenants/{tenant}/pause", tags=["operators"])
def pause_tenant(
    tenant: TenantPath, key: Operator, ctx: Ctx, body: ControlBody | None = None
) -> dict[str, Any]:
    """Pause a tenant: its runs on every queue park at their next turn boundary."""
    subject = _known(ctx, tenant=tenant)
    return dataclasses.asdict(flags.pause(ctx.client, subject, by=_by(key, body)))


@router.post("/v1/tenants/{tenant}/resume", tags=["operators"])
def resume_tenant(
    tenant: TenantPath, key: Operator, ctx: Ctx, body: ControlBody | None = None
) -> dict[str, Any]:
    """Clear a tenant's pause; its parked runs go back, each once."""
    subject = _known(ctx, tenant=tenant)
    return dataclasses.asdict(flags.resume(ctx.client, subject, by=_by(key, body)))


def _known(ctx: Ctx, *, queue: str | None = None, tenant: str | None = None) -> Subject:
    subject = Subject(queue=queue, tenant=tenant)
    try:
        subjects.check_known(ctx.client, subject)
    except ControlError as exc:
        raise Problem(404, "not_found", str(exc)) from None
    return subject
