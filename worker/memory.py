"""Long-term memory in Redis: a `jobs.memory.MemoryStore` shared by every worker process.

Each user's notes are one sorted set scored by expiry; a member is the note's JSON with a
per-user sequence number, so equal notes stay distinct and reads keep the order notes were
written in (the order `recall` breaks ties by). Expiry is decided by the `now_s` the caller
passes, never by a server clock or a TTL; a read also deletes what has expired by then.

Forgetting by source across users needs to find the users: a set per source names every user
that was ever given a note from it. It is only added to, and always before the note is written,
so it can over-count (a user whose notes from it are gone) but never miss one: a forget that
starts after an add has finished always reaches that add's note. Removing users from it safely
would need one script across two hash tags, which a cluster does not allow; the cost of keeping
them is one set member per (source, user) pair ever seen.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

import msgspec
import redis

from jobs.errors import KernelError
from jobs.memory import Note

PREFIX = "turnstile:mem"


class MemoryKeys(NamedTuple):
    """The keys of one user, all under the hash tag `{user}`."""

    notes: str  # sorted set: note record JSON, scored by expires_s
    seq: str  # counter: the last sequence number given to a note of this user


def memory_keys(user_id: str) -> MemoryKeys:
    return MemoryKeys(*(f"{PREFIX}:{{{user_id}}}:{name}" for name in MemoryKeys._fields))


def source_users_key(source: str) -> str:
    """Set: every user that was ever given a note from `source` (see the module docstring)."""
    return f"{PREFIX}:source:{{{source}}}:users"


FORGET_BATCH = 200  # users per round trip when forgetting a source across users


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
        """Two round trips: index the user under the source and take a sequence number, then
        write the note (and drop this user's notes expired by the note's own creation time)."""
        keys = memory_keys(note.user_id)
        pipe = self.client.pipeline(transaction=False)
        pipe.sadd(source_users_key(note.source), note.user_id)
        pipe.incr(keys.seq)
        _, seq = pipe.execute()
        member = msgspec.json.encode(_Record(seq=int(seq), note=note))
        pipe = self.client.pipeline(transaction=True)
        pipe.zadd(keys.notes, {member: note.expires_s})
        pipe.zremrangebyscore(keys.notes, "-inf", note.created_s)
        pipe.execute()

    def live_notes(self, user_id: str, now_s: float) -> list[Note]:
        """One round trip, atomic: drop the notes expired at `now_s` (expires_s <= now_s), read
        the rest, oldest first."""
        notes = memory_keys(user_id).notes
        pipe = self.client.pipeline(transaction=True)
        pipe.zremrangebyscore(notes, "-inf", now_s)
        pipe.zrange(notes, 0, -1)
        _, raw = pipe.execute()
        return [r.note for r in sorted(_records(raw), key=lambda r: r.seq)]

    def forget(self, *, user_id: str | None = None, source: str | None = None) -> int:
        """Delete notes by user, by source, or both; returns how many went. Counts every note
        removed, including expired ones that no read had dropped yet."""
        if user_id is not None:
            if source is None:
                return self._forget_user(user_id)
            return self._forget_from([user_id], source)
        if source is None:
            raise KernelError("forget needs a user, a source, or both")
        gone = 0
        batch: list[str] = []
        for user in self.client.sscan_iter(source_users_key(source), count=FORGET_BATCH):
            batch.append(user.decode() if isinstance(user, bytes) else user)
            if len(batch) == FORGET_BATCH:
                gone += self._forget_from(batch, source)
                batch = []
        return gone + self._forget_from(batch, source)

    def _forget_user(self, user_id: str) -> int:
        """One round trip, atomic. The sequence counter stays, so numbers keep increasing."""
        notes = memory_keys(user_id).notes
        pipe = self.client.pipeline(transaction=True)
        pipe.zcard(notes)
        pipe.delete(notes)
        count, _ = pipe.execute()
        return int(count)

    def _forget_from(self, users: list[str], source: str) -> int:
        """Two round trips for the whole batch: read the users' notes, remove those from
        `source`. ZREM counts only what it removed, so concurrent forgets never count a note
        twice; a note added after the read was added after this forget, and stays."""
        if not users:
            return 0
        pipe = self.client.pipeline(transaction=False)
        for user in users:
            pipe.zrange(memory_keys(user).notes, 0, -1)
        doomed: list[tuple[str, list[bytes | str]]] = []
        for user, raw in zip(users, pipe.execute(), strict=True):
            members = [m for m in raw if msgspec.json.decode(m, type=_Record).note.source == source]
            if members:
                doomed.append((user, members))
        if not doomed:
            return 0
        pipe = self.client.pipeline(transaction=False)
        for user, members in doomed:
            pipe.zrem(memory_keys(user).notes, *members)
        return sum(int(n) for n in pipe.execute())
