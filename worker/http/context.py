"""What every route shares: the client over the store, the caller's key, and the scope a key
gives (a service key sees its own tenant only; another tenant's run is simply not found)."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Annotated, Any

import redis
import redis.asyncio as aioredis
from fastapi import Depends, Path, Request
from fastapi.dependencies.models import Dependant
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from turnstile.worker.client._client import Client
from turnstile.worker.http import apikeys
from turnstile.worker.http.apikeys import ApiKey
from turnstile.worker.http.problems import Problem
from turnstile.worker.http.ratelimit import RateLimiter
from turnstile.worker.http.settings import ApiSettings
from turnstile.worker.http.streams import StreamSlots
from turnstile.worker.names import NAME_PATTERN, QUEUE_PATTERN, RUN_ID_PATTERN
from turnstile.worker.store import run_index

# The one rule for names (worker/names.py), as the client and the CLI apply it.
RUN_ID = RUN_ID_PATTERN
NAME = NAME_PATTERN  # tenants and users
QUEUE = QUEUE_PATTERN
# How long an operator key this server has seen may ask /readyz for the store's own error
# while the store cannot be reached to check the key (see `operator_seen`).
OPERATOR_MEMO_S = 600.0


@dataclass
class Api:
    """One per server process: the client (store, ledger, broker) and the settings."""

    client: Client
    settings: ApiSettings
    limiter: RateLimiter
    streams: aioredis.Redis  # for SSE: a quiet run's follower waits on the loop, not a thread
    slots: StreamSlots  # each key's open event streams, against its cap
    # sha256 of an operator key -> when this server last verified it (monotonic s): lets an
    # operator read /readyz's detail when the store, where keys are checked, is out of reach.
    operators: dict[str, float] = field(default_factory=dict)

    @property
    def redis(self) -> redis.Redis:
        return self.client.client

    def operator_seen(self, secret: str) -> bool:
        """Whether this server verified `secret` as a live operator key in the last
        OPERATOR_MEMO_S. Only /readyz asks, for the store's error text, nothing else."""
        seen = self.operators.get(apikeys.digest(secret))
        return seen is not None and time.monotonic() - seen < OPERATOR_MEMO_S


def api(request: Request) -> Api:
    made: Api = request.app.state.api
    return made


bearer = HTTPBearer(auto_error=False, description="An API key from `turnstile keys create`.")


def caller(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> ApiKey:
    """The key that signed this request; 401 without one, or with one that is not live."""
    challenge = {"WWW-Authenticate": "Bearer"}
    if credentials is None:
        raise Problem(401, "missing_key", "send an API key: Authorization: Bearer <key>", challenge)
    ctx = api(request)
    key = apikeys.verify(ctx.redis, credentials.credentials)
    if key is None:
        ctx.operators.pop(apikeys.digest(credentials.credentials), None)
        raise Problem(401, "invalid_key", "the API key is unknown or revoked", challenge)
    if key.operator:
        ctx.operators[key.hash] = time.monotonic()
    return key


Caller = Annotated[ApiKey, Depends(caller)]
Ctx = Annotated[Api, Depends(api)]
RunIdPath = Annotated[str, Path(pattern=RUN_ID, description="The run's id.")]


def operator(key: Caller) -> ApiKey:
    if not key.operator:
        raise Problem(403, "operator_only", "this needs an operator key")
    return key


Operator = Annotated[ApiKey, Depends(operator)]


def tenant_scope(key: ApiKey, tenant: str | None) -> str:
    """The tenant a read or a control acts on: the key's own, or any for an operator."""
    if tenant is None or tenant == key.tenant:
        return key.tenant
    if not key.operator:
        raise Problem(403, "operator_only", "a service key acts on its own tenant only")
    return tenant


def run_tenant(ctx: Api, key: ApiKey, run_id: str) -> str:
    """The run's tenant, if the key may see the run: another tenant's run is not found."""
    if key.operator:
        tenant = run_index.tenant_of(ctx.redis, run_id)
        if tenant:
            return tenant
    elif run_index.exists(ctx.redis, key.tenant, run_id):
        return key.tenant
    raise Problem(404, "run_not_found", f"no run {run_id!r}")


# -- query parameters: each one known to the route, and given once ---------------------------

_INT = re.compile(r"[0-9]{1,18}")


def _query_fields(dependant: Dependant) -> dict[str, Any]:
    """The route's query parameters by name, its dependencies' included."""
    fields = {f.alias: f for f in dependant.query_params}
    for sub in dependant.dependencies:
        fields.update(_query_fields(sub))
    return fields


def strict_query(request: Request) -> None:
    """Refuse a query parameter the route does not take (a misspelt `?limt=` is not silently
    ignored), one given twice (which would be read as one of them), and an integer that is not
    plain ASCII digits (`1_000`, ` 5`, `٣` would be read as numbers). Runs before the key is
    checked: what a route takes is public in /openapi.json."""
    dependant = getattr(request.scope.get("route"), "dependant", None)
    if dependant is None:
        return
    fields = _query_fields(dependant)  # a walk of a few dependants: cheaper than a cache
    names = [name for name, _ in request.query_params.multi_items()]
    unknown = sorted({n for n in names if n not in fields})
    if unknown:
        raise Problem(400, "unknown_parameter",
                      f"unknown query parameter(s): {', '.join(map(repr, unknown))}; "
                      f"this route takes {', '.join(sorted(fields)) or 'none'}")  # fmt: skip
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        named = ", ".join(map(repr, repeated))
        raise Problem(
            400, "repeated_parameter", f"query parameter(s) given more than once: {named}"
        )
    for name, value in request.query_params.items():
        if fields[name].field_info.annotation in (int, int | None) and not _INT.fullmatch(value):
            raise Problem(400, "invalid_parameter", f"{name} must be a whole number in digits")
