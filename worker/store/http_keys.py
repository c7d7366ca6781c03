"""Every Redis key of the HTTP API, built in one place.

API keys and webhook endpoints are few and read on every request or delivery tick, so they live
in small hashes outside the tenants' hash tags; the webhook deliverer's per-tenant positions
and each endpoint's outbox carry the tenant's tag like the run keys they follow.
"""

from __future__ import annotations

from turnstile.worker.store.keys import PREFIX

API = f"{PREFIX}:api"

KEY_HASHES = f"{API}:key-hashes"  # hash: sha256 of a key -> the key's record JSON
KEYS = f"{API}:keys"  # hash: key id -> the key's record JSON (with its hash; kept on revoke)


def console_session(session_hash: str) -> str:
    """Hash: one console session (the key it logged in with, its CSRF token, when it ends), by
    the SHA-256 of the session's id; it expires with the session, and logout deletes it."""
    return f"{API}:console:session:{session_hash}"


def key_sessions(key_id: str) -> str:
    """Set: the SHA-256s of the console sessions logged in with one key, so that revoking the
    key ends them all; it expires with the newest of them."""
    return f"{API}:console:key-sessions:{key_id}"


def rate(key_id: str, window: int, kind: str = "") -> str:
    """Counter: submissions (or, with a `kind`, other writes) of one key in one fixed window."""
    return f"{API}:rate:{key_id}:{window}" + (f":{kind}" if kind else "")


def streams(key_id: str) -> str:
    """Sorted set: one key's open event streams (a random id each), scored by when each
    lapses (ms) unless the server holding it renews it."""
    return f"{API}:streams:{key_id}"


WEBHOOKS = f"{API}:webhooks"  # hash: endpoint id -> endpoint record JSON (with its secret)
WEBHOOK_TENANTS = f"{API}:webhook-tenants"  # set: tenants with at least one endpoint
WEBHOOK_STATUS = f"{API}:webhook-status"  # hash: endpoint id -> last delivery JSON
# The one outbox of every endpoint's deliveries before each endpoint had its own: read only to
# move what an older server left there into the endpoints' outboxes.
LEGACY_OUTBOX = f"{API}:outbox"  # sorted set: delivery id -> when it is next due (ms)
LEGACY_DELIVERIES = f"{API}:deliveries"  # hash: delivery id -> delivery JSON
# One webhook deliverer scans at a time. The key keeps the name it had when the deliverer was
# called a dispatcher, so servers of both versions behind one balancer share the lease.
DELIVERY_LOCK = f"{API}:dispatch:lock"


def tenant_webhooks(tenant: str) -> str:
    """Set: the tenant's endpoint ids."""
    return f"{API}:{{{tenant}}}:webhooks"


def watch(tenant: str) -> str:
    """Hash: run id -> the last event id the deliverer read from its stream."""
    return f"{API}:{{{tenant}}}:watch"


def cursor(tenant: str) -> str:
    """String: creation ms of the newest run the deliverer has taken into its watch."""
    return f"{API}:{{{tenant}}}:cursor"


def done(tenant: str) -> str:
    """Sorted set: runs the deliverer finished with, by creation ms (kept only near the cursor,
    so a run created in the cursor's own millisecond is not taken twice)."""
    return f"{API}:{{{tenant}}}:done"


def outbox(tenant: str, endpoint_id: str) -> str:
    """Sorted set: the endpoint's delivery ids -> when each is next due (ms)."""
    return f"{API}:{{{tenant}}}:outbox:{endpoint_id}"


def deliveries(tenant: str, endpoint_id: str) -> str:
    """Hash: the endpoint's delivery ids -> delivery JSON (payload, attempts, first ms)."""
    return f"{API}:{{{tenant}}}:deliveries:{endpoint_id}"


def born(tenant: str, endpoint_id: str) -> str:
    """Sorted set: the endpoint's delivery ids -> when each event was taken (ms), so the ones
    past their retry time are found without reading the deliveries themselves."""
    return f"{API}:{{{tenant}}}:born:{endpoint_id}"


def endpoint_queue(tenant: str, endpoint_id: str) -> tuple[str, str, str]:
    """Every key that holds an endpoint's pending deliveries (dropped with the endpoint)."""
    return outbox(tenant, endpoint_id), deliveries(tenant, endpoint_id), born(tenant, endpoint_id)
