"""Long-term memory: who may write, whose a note is, how long it lasts, how it is removed.

Retrieval here is plain word overlap so that the policy is what shows: scope and expiry are
applied before any matching, with the tenant and the user id taken from the run, never from
the query. A note belongs to one user of one tenant: two tenants' users of the same id never
see each other's notes. A
recalled note is content, shown to the model labelled as remembered, never as an instruction.
"""

from __future__ import annotations

import re
from typing import Protocol

import msgspec

from turnstile.jobs.errors import KernelError

# Content written by someone other than the user or the system (a retrieved page, an email
# body, free text from a tool) is not on this list: storing it would let its author speak to
# every later session.
TRUSTED_SOURCES = frozenset({"user_message", "validated_tool"})
MAX_NOTE_CHARS = 2000


class Note(msgspec.Struct, kw_only=True, frozen=True):
    tenant: str
    user_id: str
    text: str
    source: str
    created_s: float
    expires_s: float


class MemoryStore(Protocol):
    def add(self, note: Note) -> None: ...

    def live_notes(self, tenant: str, user_id: str, now_s: float) -> list[Note]:
        """Notes of this tenant's user only, not yet expired."""
        ...

    def forget(self, *, tenant: str, user_id: str | None = None, source: str | None = None) -> int:
        """Delete a tenant's notes by user, by source, or both; returns how many went."""
        ...


def words(text: str) -> set[str]:
    """Crude terms: words of four letters or more, trailing s dropped."""
    return {w.rstrip("s") for w in re.findall(r"[a-z]+", text.lower()) if len(w) > 3}


def remember(
    store: MemoryStore,
    *,
    tenant: str,
    user_id: str,
    text: str,
    source: str,
    now_s: float,
    ttl_s: float,
) -> str:
    """Store a note if its source may write memory; say what happened either way."""
    if source not in TRUSTED_SOURCES:
        return "rejected: source not trusted for memory"
    if not tenant or not user_id or not text.strip():
        return "rejected: a note needs a tenant, a user and some text"
    if ttl_s <= 0:
        return "rejected: a note needs a positive lifetime"
    store.add(
        Note(
            tenant=tenant,
            user_id=user_id,
            text=text[:MAX_NOTE_CHARS],
            source=source,
            created_s=now_s,
            expires_s=now_s + ttl_s,
        )
    )
    return "stored"


def recall(
    store: MemoryStore, *, tenant: str, user_id: str, query: str, now_s: float, k: int = 2
) -> list[str]:
    """Up to k of this tenant's user's live notes that share a term with the query, best
    first."""
    terms = words(query)
    live = store.live_notes(tenant, user_id, now_s)
    scored = [(len(terms & words(n.text)), i, n) for i, n in enumerate(live)]
    scored.sort(key=lambda item: (-item[0], item[1]))
    return [n.text for score, _, n in scored[:k] if score > 0]


class InMemoryMemory:
    def __init__(self) -> None:
        self.notes: list[Note] = []

    def add(self, note: Note) -> None:
        self.notes.append(note)

    def live_notes(self, tenant: str, user_id: str, now_s: float) -> list[Note]:
        return [
            n
            for n in self.notes
            if n.tenant == tenant and n.user_id == user_id and n.expires_s > now_s
        ]

    def forget(self, *, tenant: str, user_id: str | None = None, source: str | None = None) -> int:
        if user_id is None and source is None:
            raise KernelError("forget needs a user, a source, or both")

        def doomed(n: Note) -> bool:
            return (
                n.tenant == tenant
                and (user_id is None or n.user_id == user_id)
                and (source is None or n.source == source)
            )

        keep = [n for n in self.notes if not doomed(n)]
        gone = len(self.notes) - len(keep)
        self.notes = keep
        return gone
