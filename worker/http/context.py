"""What every route shares: the client over the store, the caller's key, and the scope a key
gives (a service key sees its own tenant only; another tenant's run is simply not found)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated

import redis
import redis.asyncio as aioredis
from fastapi import Depends, Path, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from turnstile.worker.client._client import Client
from turnstile.worker.http import apikeys
from turnstile.worker.http.apikeys import ApiKey
from turnstile.worker.http.problems import Problem
from turnstile.worker.http.ratelimit import RateLimiter
from turnstile.worker.http.settings import ApiSettings
from turnstile.worker.store import keys

# As the client accepts them, none starting with '-' (a command line could not name it again).
RUN_ID = r"^[A-Za-z0-9_.:][A-Za-z0-9_.:\-]{0,127}$"
NAME = r"^[A-Za-z0-9_.][A-Za-z0-9_.\-]{0,127}$"  # tenants and queues
RUN_ID_RE = re.compile(RUN_ID)


@dataclass
class Api:
    """One per server process: the client (store, ledger, broker) and the settings."""

    client: Client
    settings: ApiSettings
    limiter: RateLimiter
    streams: aioredis.Redis  # for SSE: a quiet run's follower waits on the loop, not a thread

    @property
    def redis(self) -> redis.Redis:
        return self.client.client


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
    key = apikeys.verify(api(request).redis, credentials.credentials)
    if key is None:
        raise Problem(401, "invalid_key", "the API key is unknown or revoked", challenge)
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
        tenant = ctx.redis.hget(keys.RUN_TENANTS, run_id)
        if tenant:
            return str(tenant)
    elif ctx.redis.exists(keys.run(key.tenant, run_id)):
        return key.tenant
    raise Problem(404, "run_not_found", f"no run {run_id!r}")
