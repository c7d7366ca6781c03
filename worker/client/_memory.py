"""The Client's long-term memory calls: a tenant's user's notes (`Memory`, which `Client` is
made of)."""

from __future__ import annotations

import time

from turnstile.jobs.memory import Note, recall, remember
from turnstile.worker.names import check_name
from turnstile.worker.store.memory import RedisMemory


class Memory:
    """Long-term memory, for `Client`, over the Redis memory it holds."""

    memory: RedisMemory

    def remember(self, tenant: str, user: str, text: str, *, source: str, ttl_s: float) -> str:
        """Store a note for a tenant's user if its source may write memory; says what
        happened."""
        check_name("tenant", tenant)
        check_name("user", user)
        return remember(
            self.memory, tenant=tenant, user_id=user, text=text, source=source,
            now_s=time.time(), ttl_s=ttl_s,
        )  # fmt: skip

    def recall(self, tenant: str, user: str, query: str) -> list[str]:
        """The tenant's user's live notes that match the query: shown to the model, labelled
        as remembered, in the run's first view. Scoped to the tenant and the user before any
        matching."""
        if not all(isinstance(v, str) and v.strip() for v in (tenant, user)):
            return []
        return recall(self.memory, tenant=tenant, user_id=user, query=query, now_s=time.time())

    def forget(self, tenant: str, *, user: str | None = None, source: str | None = None) -> int:
        """Delete a tenant's notes by user, by source, or both; how many went."""
        check_name("tenant", tenant)
        if user is not None:
            check_name("user", user)
        return self.memory.forget(tenant=tenant, user_id=user, source=source)

    def notes(self, tenant: str, *, user: str | None = None) -> list[Note]:
        """A tenant's live notes, one user's or every user's."""
        check_name("tenant", tenant)
        if user is not None:
            check_name("user", user)
        return self.memory.notes(tenant, time.time(), user_id=user)
