"""Webhook endpoints: a tenant registers an HTTP(S) URL for `run.needs_approval` and
`run.finished`; the secret that signs its deliveries is shown once, at registration.

Deliveries are made by the webhook deliverer (`worker.http.webhook_delivery`), outside the
step: it learns of events by reading what every commit already writes (the runs index and each
run's event stream), so a slow or failing endpoint can never hold a turn back.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Any

import structlog
from fastapi import APIRouter, Path, Query, Response
from pydantic import BaseModel, Field

from turnstile.worker.http import targets
from turnstile.worker.http.bodies import JsonRoute
from turnstile.worker.http.context import NAME, Caller, Ctx, tenant_scope
from turnstile.worker.http.problems import Problem
from turnstile.worker.http.routes_runs import PROBLEMS
from turnstile.worker.http.schemas import Strict
from turnstile.worker.http.settings import ApiSettings
from turnstile.worker.store import webhooks as stored
from turnstile.worker.store.webhooks import Endpoint, endpoints

log = structlog.get_logger("turnstile.webhooks")

MAX_ENDPOINTS = 20  # per tenant: each is one more delivery per event
SIGNATURE_HEADER = "Turnstile-Signature"
TIMESTAMP_HEADER = "Turnstile-Timestamp"


class WebhookEvent(StrEnum):
    NEEDS_APPROVAL = "run.needs_approval"
    FINISHED = "run.finished"


# The stream event each webhook event is read from. A `suspended` event is any held decision:
# a call to approve (`kind: "call"`) or a budget to extend (`kind: "budget"`).
FROM_STREAM = {"suspended": WebhookEvent.NEEDS_APPROVAL, "finished": WebhookEvent.FINISHED}


def sign(secret: str, timestamp: str, body: bytes) -> str:
    """HMAC-SHA256 of `timestamp.body` with the endpoint's secret, as the header carries it."""
    mac = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return f"v1={mac.hexdigest()}"


def verify(secret: str, timestamp: str, body: bytes, signature: str) -> bool:
    """What a receiver does: recompute and compare in constant time."""
    return hmac.compare_digest(sign(secret, timestamp, body), signature)


def target_checker(settings: ApiSettings) -> targets.Checker:
    """What decides where this server's webhooks may go (also at each delivery)."""
    return targets.checker(
        settings.webhook_allow, settings.webhook_hosts_file, settings.webhook_https_only
    )


def _check_url(url: str, settings: ApiSettings, tenant: str) -> None:
    """Refuse what could not be sent, or would be sent somewhere internal (see targets)."""
    try:
        target_checker(settings).check(url)
    except targets.TargetError as exc:
        log.info("webhook_target_refused", tenant=tenant, code=exc.code, reason=exc.reason,
                 address=exc.address)  # fmt: skip
        raise Problem(422, exc.code, exc.reason) from None


class WebhookBody(Strict):
    url: str = Field(min_length=8, max_length=2000)
    events: list[WebhookEvent] = Field(
        default_factory=lambda: list(WebhookEvent), min_length=1, max_length=2
    )
    description: str = Field(default="", max_length=200)


class WebhookCreated(BaseModel):
    id: str
    url: str
    events: list[str]
    description: str
    created_at: str
    secret: str = Field(description="Signs every delivery; shown only now.")


router = APIRouter(responses=PROBLEMS, tags=["webhooks"], route_class=JsonRoute)
EndpointId = Annotated[str, Path(pattern=r"^wh_[0-9a-f]{16}$")]


@router.post("/v1/webhooks", status_code=201, response_model=WebhookCreated)
def create_webhook(body: WebhookBody, key: Caller, ctx: Ctx) -> WebhookCreated:
    """Register an endpoint for the key's tenant's run events."""
    _check_url(body.url, ctx.settings, key.tenant)
    made = Endpoint(
        id=f"wh_{secrets.token_hex(8)}", tenant=key.tenant, url=body.url,
        events=sorted({e.value for e in body.events}),
        secret=f"whsec_{secrets.token_urlsafe(32)}",
        created_at=datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        description=body.description,
    )  # fmt: skip
    if not stored.add(ctx.redis, made, MAX_ENDPOINTS):
        raise Problem(409, "too_many_webhooks", f"a tenant has at most {MAX_ENDPOINTS} endpoints")
    return WebhookCreated(**{k: v for k, v in made.public().items() if k != "last_delivery"},
                          secret=made.secret)  # fmt: skip


@router.get("/v1/webhooks")
def list_webhooks(
    key: Caller,
    ctx: Ctx,
    tenant: Annotated[str | None, Query(pattern=NAME, description="Operators only.")] = None,
) -> dict[str, Any]:
    """The tenant's endpoints, each with its last delivery (never the secrets); an operator
    key may name another tenant with `?tenant=`."""
    found = endpoints(ctx.redis, tenant_scope(key, tenant))
    status = stored.statuses(ctx.redis, [e.id for e in found])
    return {"webhooks": [e.public(s) for e, s in zip(found, status, strict=True)]}


@router.delete("/v1/webhooks/{endpoint_id}", status_code=204, response_class=Response)
def delete_webhook(endpoint_id: EndpointId, key: Caller, ctx: Ctx) -> Response:
    """Remove an endpoint; deliveries still pending for it are dropped."""
    if not stored.remove(ctx.redis, key.tenant, endpoint_id):
        raise Problem(404, "webhook_not_found", f"no webhook {endpoint_id!r}")
    return Response(status_code=204)
