"""A Ledger checks a tenant's name and builds its KEYS once, then reuses them.

The cache must neither let a bad name through on a later call nor share a list that a caller
can change.
"""

from __future__ import annotations

from typing import Any

import pytest

from turnstile.ledger import Ledger, LedgerInputError
from turnstile.ledger.inputs import check_tenant
from turnstile.ledger.keys import tenant_keys


def unreachable_ledger() -> Ledger:
    # Registering scripts does no I/O, and building script arguments does none either.
    return Ledger.from_url("redis://127.0.0.1:1/0")


@pytest.mark.parametrize("tenant", ["", "a b", "{t}", "x" * 129, 7, None])
def test_a_bad_tenant_is_refused_every_time(tenant: Any) -> None:
    """Checked names are remembered; refused ones are not."""
    ledger = unreachable_ledger()
    for _ in range(2):
        with pytest.raises(LedgerInputError) as raised:
            ledger.settle_script_args(tenant, "r", {})
        with pytest.raises(LedgerInputError) as direct:
            check_tenant(tenant)
        assert str(raised.value) == str(direct.value)


def test_returned_keys_are_the_callers_own() -> None:
    """Changing the KEYS one call returned does not change the next call's."""
    ledger = unreachable_ledger()
    keys, _ = ledger.settle_script_args("acme", "r", {})
    keys.append("mine")
    again, _ = ledger.reserve_script_args("acme", "r", {"tokens": 1}, timeout_s=1)
    assert again == tenant_keys("acme")
