"""API keys: created for a tenant with a role, shown once, stored only as their SHA-256.

A key is 32 random bytes (256 bits), so a plain SHA-256 is enough to store it: there is
nothing to guess that a slow hash would protect. A request's key is looked up by its hash in
one HGET; a revoked key's hash is deleted in the same transaction that marks its record, so it
stops working on the next request of every server, and the console sessions logged in with it
are deleted with it (`end_sessions`).
"""

from __future__ import annotations

import hashlib
import re
import secrets
from datetime import UTC, datetime
from enum import StrEnum

import msgspec
import redis

from turnstile.errors import InvalidNameError, TurnstileError
from turnstile.worker.names import check_name
from turnstile.worker.store import credentials

KEY_PREFIX = "tsk_"
NAME = re.compile(r"^[A-Za-z0-9_.@:\-]{1,64}$")


class Role(StrEnum):
    SERVICE = "service"  # its own tenant's runs, ledger, memory and webhooks
    OPERATOR = "operator"  # every tenant, and the queue and tenant controls


class ApiKeyError(TurnstileError):
    """A key command that does not apply (a bad tenant or name, an unknown key id)."""


class ApiKey(msgspec.Struct, frozen=True):
    id: str
    tenant: str
    role: Role
    name: str
    created_at: str
    hash: str = ""
    revoked_at: str = ""

    @property
    def operator(self) -> bool:
        return self.role is Role.OPERATOR

    def public(self) -> dict[str, str]:
        """What a listing shows: never the hash."""
        return {"id": self.id, "tenant": self.tenant, "role": self.role.value,
                "name": self.name, "created_at": self.created_at,
                "revoked_at": self.revoked_at}  # fmt: skip


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def check_tenant(tenant: str) -> str:
    """A key's tenant, by the one rule for names (worker/names.py)."""
    try:
        return check_name("tenant", tenant)
    except InvalidNameError as exc:
        raise ApiKeyError(str(exc)) from None


def create(
    client: redis.Redis, *, tenant: str, role: Role = Role.SERVICE, name: str | None = None
) -> tuple[ApiKey, str]:
    """A new key: its record, and the key itself (the only time it is shown)."""
    check_tenant(tenant)
    key_id = f"key_{secrets.token_hex(6)}"
    name = name or f"{tenant}.{key_id}"
    if not NAME.match(name):
        raise ApiKeyError("name must be 1-64 letters, digits, '.', '_', '@', ':' or '-'")
    secret = f"{KEY_PREFIX}{secrets.token_urlsafe(32)}"
    record = ApiKey(key_id, tenant, Role(role), name, _now(), digest(secret))
    credentials.add_key(client, key_id, record.hash, msgspec.json.encode(record))
    return record, secret


def listed(client: redis.Redis, tenant: str | None = None) -> list[ApiKey]:
    records = [msgspec.json.decode(raw, type=ApiKey) for raw in credentials.key_records(client)]
    return sorted(
        (r for r in records if tenant is None or r.tenant == tenant),
        key=lambda r: (r.created_at, r.id),
    )


def revoke(client: redis.Redis, key_id: str) -> ApiKey:
    """Revoke a key at once, and end the console sessions logged in with it; revoking a
    revoked key changes nothing (but ends any session still recorded for it)."""
    raw = credentials.key_record(client, key_id)
    if raw is None:
        raise ApiKeyError(f"no key {key_id!r}")
    record = msgspec.json.decode(raw, type=ApiKey)
    if record.revoked_at:
        end_sessions(client, key_id)
        return record
    revoked = msgspec.structs.replace(record, revoked_at=_now())
    credentials.revoke_key(client, key_id, record.hash, msgspec.json.encode(revoked))
    end_sessions(client, key_id)
    return revoked


def end_sessions(client: redis.Redis, key_id: str) -> int:
    """Delete every console session logged in with the key; how many there were. (A session
    also checks its key on every request, so one written after this read ends there.)"""
    return credentials.end_sessions(client, key_id)


def verify(client: redis.Redis, secret: str) -> ApiKey | None:
    """The live key with this secret, or None."""
    if not secret.startswith(KEY_PREFIX) or len(secret) > 128:
        return None
    raw = credentials.live_key(client, digest(secret))
    return None if raw is None else msgspec.json.decode(raw, type=ApiKey)
