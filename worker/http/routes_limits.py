"""Provider rate limits per model endpoint (`turnstile limits`), for operators: read, set,
remove. The checks are the library's (worker/scheduling/ratelimits.py): an unknown endpoint
or a limit below 1 is refused with nothing written."""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query
from pydantic import Field, StrictInt

from turnstile.worker.http.bodies import JsonRoute
from turnstile.worker.http.context import NAME, Ctx, Operator
from turnstile.worker.http.routes_runs import PROBLEMS
from turnstile.worker.http.schemas import Strict
from turnstile.worker.names import ENDPOINT_PATTERN
from turnstile.worker.scheduling import ratelimits

router = APIRouter(responses=PROBLEMS, tags=["operators"], route_class=JsonRoute)

EndpointPath = Annotated[
    str,
    Path(
        pattern=ENDPOINT_PATTERN,  # the one rule for names (worker/names.py)
        description="The model endpoint: a model string, e.g. openai:gpt-4.1-mini.",
    ),
]
TenantQuery = Annotated[
    str | None,
    Query(pattern=NAME, description="A tenant's own share of the endpoint, within its limits."),
]


class LimitsBody(Strict):
    """Requests and tokens per minute, each a whole number from 1, and the burst: seconds'
    worth of them that may go at once (no 60 s passes more than the limit). At least one of
    rpm and tpm, or a burst for limits set before."""

    rpm: StrictInt | None = Field(
        default=None, ge=1, le=ratelimits.MAX_LIMIT, description="Requests per minute."
    )
    tpm: StrictInt | None = Field(
        default=None, ge=1, le=ratelimits.MAX_LIMIT, description="Tokens per minute."
    )
    burst_s: StrictInt | None = Field(
        default=None, ge=0, le=ratelimits.MAX_BURST_S,
        description=f"Seconds' worth of the limits that may go at once (default "
        f"{ratelimits.DEFAULT_BURST_S}).",
    )  # fmt: skip
    tenant: str | None = Field(
        default=None, pattern=NAME, description="A tenant's own share of the endpoint."
    )


def _views(ctx: Ctx, endpoint: str | None) -> dict[str, Any]:
    views = ratelimits.show_limits(ctx.redis, endpoint, providers=ctx.client.config.providers)
    return {"limits": [dataclasses.asdict(v) for v in views]}


@router.get("/v1/limits")
def list_limits(_: Operator, ctx: Ctx) -> dict[str, Any]:
    """Every rate limit set, with its bucket now (`turnstile limits show`)."""
    return _views(ctx, None)


@router.put("/v1/limits/{endpoint:path}")
def set_limits(endpoint: EndpointPath, body: LimitsBody, _: Operator, ctx: Ctx) -> dict[str, Any]:
    """Set an endpoint's limits, or a tenant's share of it (`turnstile limits set`); the
    endpoint's limits as they stand after."""
    given = (("rpm", body.rpm), ("tpm", body.tpm), (ratelimits.BURST, body.burst_s))
    pairs = [f"{name}={value}" for name, value in given if value is not None]
    limits = ratelimits.parse_limits(pairs)
    providers = ctx.client.config.providers
    ratelimits.set_limits(ctx.redis, endpoint, limits, body.tenant, providers=providers)
    return _views(ctx, endpoint)


@router.delete("/v1/limits/{endpoint:path}")
def unset_limits(
    endpoint: EndpointPath,
    _: Operator,
    ctx: Ctx,
    tenant: TenantQuery = None,
    limit: Annotated[
        list[str] | None, Query(description="rpm, tpm: the limits to remove (default both).")
    ] = None,
) -> dict[str, Any]:
    """Remove an endpoint's limits, or a tenant's share (`turnstile limits unset`)."""
    providers = ctx.client.config.providers
    removed = ratelimits.unset_limits(ctx.redis, endpoint, limit or (), tenant, providers=providers)
    return {"removed": removed, **_views(ctx, endpoint)}
