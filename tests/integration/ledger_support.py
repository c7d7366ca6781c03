"""Test support for the ledger: a Ledger whose scripts read a simulated clock.

Production scripts take `now` from the server's TIME. Here a line placed between the library
and each operation shadows `ledger_now` with a read of a per-tenant clock key, so tests can
cross deadlines and day or month boundaries without sleeping. Everything else (validation,
admission, settlement, expiry order) is the production library, unchanged.
"""

from __future__ import annotations

from turnstile.ledger import Ledger
from turnstile.ledger.keys import tenant_key, tenant_keys
from turnstile.ledger.scripts import library_source, operation_source

_CLOCK_SHADOW = """
local ledger_now = function()
  return tonumber(redis.call('GET', KEYS[7]))
end
"""


class ClockedLedger(Ledger):
    """A Ledger on a simulated clock: call `set_clock` before each operation that needs it."""

    def _source(self, operation: str) -> str:
        return library_source() + "\n" + _CLOCK_SHADOW + "\n" + operation_source(operation)

    def _keys(self, tenant: str) -> list[str]:
        return [*tenant_keys(tenant), tenant_key(tenant, "test-clock")]

    def set_clock(self, tenant: str, now_ms: int) -> None:
        self.client.set(tenant_key(tenant, "test-clock"), str(now_ms))


def raw_usage(ledger: Ledger, tenant: str) -> dict[str, int]:
    """Every usage figure of the tenant, every bucket: {"c:tokens:all": 12, ...}."""
    raw: dict[str, str] = ledger.client.hgetall(tenant_keys(tenant)[1])  # type: ignore[assignment]
    return {field: int(value) for field, value in raw.items() if field != "indexed"}
