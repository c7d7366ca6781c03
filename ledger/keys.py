"""Every Redis key of the ledger, built in one place.

All keys of one tenant share the hash tag `{tenant}`, so each script touches one cluster slot.
The run keys of the worker use the same tag, which lets its commit script settle atomically.
"""

from __future__ import annotations

PREFIX = "turnstile:ledger"

# The order of the six keys is the library's contract (see lib.lua); do not reorder.
TENANT_KEY_NAMES = ("limits", "usage", "records", "deadlines", "resolved", "journal")

PENDING_TENANTS = f"{PREFIX}:pending-tenants"
"""Set of tenants that may hold pending reservations, for the periodic reaper. No tenant tag:
it is only touched outside the per-tenant scripts."""


def tenant_key(tenant: str, name: str) -> str:
    """One key of `tenant`, tagged so that all of the tenant's keys share a slot."""
    return f"{PREFIX}:{{{tenant}}}:{name}"


def tenant_keys(tenant: str) -> list[str]:
    """The six keys every ledger script takes as KEYS, in the library's order."""
    return [tenant_key(tenant, name) for name in TENANT_KEY_NAMES]


def journal_key(tenant: str) -> str:
    return tenant_key(tenant, "journal")


def usage_key(tenant: str) -> str:
    return tenant_key(tenant, "usage")
