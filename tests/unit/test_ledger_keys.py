"""Key layout: one hash tag per tenant, so every script stays in one cluster slot."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from redis.crc import key_slot

from turnstile.ledger.keys import PENDING_TENANTS, tenant_key, tenant_keys


@given(
    st.text(
        alphabet=st.characters(exclude_categories=["Cs"], exclude_characters="{}"),
        min_size=1,
        max_size=40,
    )
)
def test_all_keys_of_a_tenant_share_one_slot(tenant: str) -> None:
    """Every key of a tenant, and any key the worker tags the same way, hashes to one slot."""
    slots = {key_slot(k.encode()) for k in [*tenant_keys(tenant), tenant_key(tenant, "run:1")]}
    assert len(slots) == 1


def test_tenant_keys_are_distinct_and_prefixed() -> None:
    """The six keys are distinct, under the ledger prefix, and the global set is untagged."""
    keys = tenant_keys("acme")
    assert len(set(keys)) == 6
    assert all(k.startswith("turnstile:ledger:{acme}:") for k in keys)
    assert "{" not in PENDING_TENANTS
