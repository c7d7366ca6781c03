"""Long-term memory in Redis: a `jobs.memory.MemoryStore` shared by every worker process.

Notes belong to one user of one tenant, and every key carries the tenant's hash tag (see
worker/store/keys.py): a user id that two tenants both use names two people, whose notes never
meet. Each user's notes are one sorted set scored by expiry; a member is the note's JSON with a
per-user sequence number, so equal notes stay distinct and reads keep the order notes were
written in (the order `recall` breaks ties by). Expiry is decided by the `now_s` the caller
passes, never by a server clock or a TTL; a read also deletes what has expired by then.

Forgetting by source, and listing a tenant's notes, need to find the users: a set per tenant
(and one per tenant and source) names every user that was ever given a note. They are only
added to, and always before the note is written, so they can over-count (a user whose notes
are gone) but never miss one: a forget that starts after an add has finished always reaches
that add's note.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import msgspec
import redis

from turnstile.jobs.errors import KernelError
from turnstile.jobs.memory import Note
from turnstile.worker.store import keys
from turnstile.worker.store.values import text

FORGET_BATCH = 200  # users per round trip when forgetting a source or listing across users


class _Record(msgspec.Struct):
    seq: int
    note: Note


def _records(raw: Iterable[bytes | str]) -> list[_Record]:
    return [msgspec.json.decode(member, type=_Record) for member in raw]


class RedisMemory:
    """A `MemoryStore` over one Redis client."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client

    def add(self, note: Note) -> None:
        """Two round trips: index the user under the tenant and the source and take a sequence
        number, then write the note (and drop this user's notes expired by the note's own
        creation time)."""
        tenant, user = note.tenant, note.user_id
        pipe = self.client.pipeline(transaction=False)
        pipe.sadd(keys.memory_users(tenant), user)
        pipe.sadd(keys.memory_source_users(tenant, note.source), user)
        pipe.incr(keys.memory_seq(tenant, user))
        *_, seq = pipe.execute()
        member = msgspec.json.encode(_Record(seq=int(seq), note=note))
        notes = keys.memory_notes(tenant, user)
        pipe = self.client.pipeline(transaction=True)
        pipe.zadd(notes, {member: note.expires_s})
        pipe.zremrangebyscore(notes, "-inf", note.created_s)
        pipe.execute()

    def live_notes(self, tenant: str, user_id: str, now_s: float) -> list[Note]:
        """One round trip, atomic: drop the notes expired at `now_s` (expires_s <= now_s), read
        the rest, oldest first."""
        notes = keys.memory_notes(tenant, user_id)
        pipe = self.client.pipeline(transaction=True)
        pipe.zremrangebyscore(notes, "-inf", now_s)
        pipe.zrange(notes, 0, -1)
        _, raw = pipe.execute()
        return [r.note for r in sorted(_records(raw), key=lambda r: r.seq)]

    def notes(self, tenant: str, now_s: float, user_id: str | None = None) -> list[Note]:
        """The tenant's live notes, one user's or every user's, by user and then oldest
        first. Reads only: expired notes are skipped, not deleted."""
        out: list[Note] = []
        for batch in self._user_batches(keys.memory_users(tenant), only=user_id):
            pipe = self.client.pipeline(transaction=False)
            for user in batch:
                pipe.zrangebyscore(keys.memory_notes(tenant, user), f"({now_s}", "+inf")
            for raw in pipe.execute():
                out += [r.note for r in sorted(_records(raw), key=lambda r: r.seq)]
        return sorted(out, key=lambda n: n.user_id)  # stable: each user's order is kept

    def forget(self, *, tenant: str, user_id: str | None = None, source: str | None = None) -> int:
        """Delete a tenant's notes by user, by source, or both; returns how many went. Counts
        every note removed, including expired ones that no read had dropped yet."""
        if user_id is not None and source is None:
            return self._forget_user(tenant, user_id)
        if source is None:
            raise KernelError("forget needs a user, a source, or both")
        users = keys.memory_source_users(tenant, source)
        return sum(
            self._forget_from(tenant, batch, source)
            for batch in self._user_batches(users, only=user_id)
        )

    def _user_batches(self, users_key: str, *, only: str | None) -> Iterator[list[str]]:
        if only is not None:
            yield [only]
            return
        batch: list[str] = []
        for user in self.client.sscan_iter(users_key, count=FORGET_BATCH):
            batch.append(text(user))
            if len(batch) == FORGET_BATCH:
                yield batch
                batch = []
        if batch:
            yield batch

    def _forget_user(self, tenant: str, user_id: str) -> int:
        """One round trip, atomic. The sequence counter stays, so numbers keep increasing."""
        notes = keys.memory_notes(tenant, user_id)
        pipe = self.client.pipeline(transaction=True)
        pipe.zcard(notes)
        pipe.delete(notes)
        count, _ = pipe.execute()
        return int(count)

    def _forget_from(self, tenant: str, users: list[str], source: str) -> int:
        """Two round trips for the whole batch: read the users' notes, remove those from
        `source`. ZREM counts only what it removed, so concurrent forgets never count a note
        twice; a note added after the read was added after this forget, and stays."""
        pipe = self.client.pipeline(transaction=False)
        for user in users:
            pipe.zrange(keys.memory_notes(tenant, user), 0, -1)
        doomed: list[tuple[str, list[bytes | str]]] = []
        for user, raw in zip(users, pipe.execute(), strict=True):
            members = [m for m in raw if msgspec.json.decode(m, type=_Record).note.source == source]
            if members:
                doomed.append((user, members))
        if not doomed:
            return 0
        pipe = self.client.pipeline(transaction=False)
        for user, members in doomed:
            pipe.zrem(keys.memory_notes(tenant, user), *members)
        return sum(int(n) for n in pipe.execute())
