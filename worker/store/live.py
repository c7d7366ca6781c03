"""A run's live output: one Redis stream per run, apart from its events.

Keys (the run's tenant's hash tag, so one XREAD reads it with the run's events in one slot):

    turnstile:{T}:live:<run id>   stream; each entry's one field `live` is a JSON object:
        {"type": "text", "turn", "attempt", "text"}            the model's answer, batched
        {"type": "tool_started", "turn", "attempt", "call", "tool"}
        {"type": "tool_ended", "turn", "attempt", "call", "tool", "status"}
        {"type": "progress", "turn", "attempt", "call", "tool", "note"}
        {"type": "abandoned", "turn", "attempt", "reason"}     drop the turn's text before it
        each with "live": true, so a reader mixing it with the events tells them apart.

Written by the worker as a turn runs (worker/runtime/live.py): XADD with MAXLEN ~ the bound,
so a stream nobody reads stays that long, and EXPIRE each write, so a run's live output goes
with its retention (run_expire.lua also deletes it with the run). It is never the truth: the
run's committed `turn` event is. A reader reads both streams in one XREAD (`read`, `read_async`)
and orders their entries by id, the store's clock for both.

Only a run someone reads live is written: each reader sets `turnstile:{T}:live-readers:<run
id>` again as it reads (`watch`), and it expires `READER_TTL_S` after the last one left; a turn
that starts with nobody watching streams nothing and costs nothing more: the turn's load (the
script run_load.lua, or the eager commit that claimed the turn) says whether the key exists.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
import redis
import redis.asyncio as aioredis

from turnstile.worker.store import keys
from turnstile.worker.store.values import text

FIELD = "live"  # a live entry's one field
EVENT = "event"  # an event entry's one field (the commit's)
NO_ENTRY = "0-0"
_STREAM_ID = r"[0-9]{1,20}-[0-9]{1,20}"
# A cursor over both streams: the last event's id and the last live entry's id, as one SSE id
# (and `RunEvent.id` for a live reader): "<event id>/<live id>".
CURSOR = re.compile(rf"({_STREAM_ID})/({_STREAM_ID})")


@dataclass(frozen=True)
class Entry:
    """One entry of either stream: `live` says which, `id` is its id in its own stream."""

    id: str
    data: dict[str, Any]
    live: bool
    raw: str  # the entry's JSON as stored (an SSE frame's data, unchanged)

    @property
    def type(self) -> str:
        return str(self.data.get("type") or "message")


@dataclass(frozen=True)
class Cursor:
    """Where a reader of both streams is: the last event and the last live entry it was given."""

    events: str = NO_ENTRY
    live: str = NO_ENTRY

    def __str__(self) -> str:
        return f"{self.events}/{self.live}"

    def past(self, entry: Entry) -> Cursor:
        if entry.live:
            return Cursor(self.events, entry.id)
        return Cursor(entry.id, self.live)

    @classmethod
    def parse(cls, value: str) -> Cursor | None:
        """A cursor as `str` gives it, or an event id alone (the live stream from its start);
        None for anything else."""
        both = CURSOR.fullmatch(value)
        if both:
            return cls(both.group(1), both.group(2))
        if re.fullmatch(_STREAM_ID, value):
            return cls(value, NO_ENTRY)
        return None


READER_TTL_S = 15  # a reader sets it again at least every block (a few seconds) it waits


def watch(client: redis.Redis, tenant: str, run_id: str) -> None:
    """Say that someone reads the run's live output now (for `READER_TTL_S`)."""
    client.set(keys.live_readers(tenant, run_id), "1", ex=READER_TTL_S)


async def watch_async(r: aioredis.Redis, tenant: str, run_id: str) -> None:
    """`watch`, on an asyncio client."""
    await r.set(keys.live_readers(tenant, run_id), "1", ex=READER_TTL_S)


def append(
    client: redis.Redis, tenant: str, run_id: str, entries: Sequence[Mapping[str, Any]], *,
    maxlen: int, ttl_s: int,
) -> None:  # fmt: skip
    """Append entries to the run's live stream in one round trip, trimmed to about `maxlen`,
    expiring `ttl_s` after this write."""
    key = keys.live(tenant, run_id)
    pipe = client.pipeline(transaction=False)
    for entry in entries:
        data = msgspec.json.encode({**entry, "live": True})
        pipe.xadd(key, {FIELD: data}, maxlen=maxlen, approximate=True)
    pipe.expire(key, ttl_s)
    pipe.execute()


def _entries(reply: Any, tenant: str, run_id: str) -> list[Entry]:
    """Both streams' entries of an XREAD reply in the store's time order; within the same
    millisecond the live entries first: the worker writes a turn's last text before its commit
    (a sequence number counts within its own stream only)."""
    live_key = keys.live(tenant, run_id)
    out: list[Entry] = []
    for stream, entries in reply or []:
        is_live = text(stream) == live_key
        name = FIELD if is_live else EVENT
        for entry_id, fields in entries:
            raw = text(fields.get(name) if name in fields else fields.get(name.encode())) or "{}"
            try:
                data = msgspec.json.decode(raw)
            except msgspec.DecodeError:
                data = {"type": "message"}
            out.append(Entry(text(entry_id), data if isinstance(data, dict) else {}, is_live, raw))
    return sorted(out, key=lambda e: (_order(e.id)[0], not e.live, _order(e.id)[1]))


def _order(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def _streams(tenant: str, run_id: str, cursor: Cursor) -> Any:
    return {keys.events(tenant, run_id): cursor.events, keys.live(tenant, run_id): cursor.live}


def read(
    client: redis.Redis, tenant: str, run_id: str, cursor: Cursor, *, count: int,
    block_ms: int | None,
) -> list[Entry]:  # fmt: skip
    """Up to `count` entries of each stream after the cursor, in id order; waits up to
    `block_ms` for one when there is none yet (None: does not wait)."""
    reply: Any = client.xread(_streams(tenant, run_id, cursor), count=count, block=block_ms)
    return _entries(reply, tenant, run_id)


async def read_async(
    r: aioredis.Redis, tenant: str, run_id: str, cursor: Cursor, *, count: int,
    block_ms: int | None = None,
) -> list[Entry]:  # fmt: skip
    """`read`, on an asyncio client (the HTTP API's event streams)."""
    reply: Any = await r.xread(_streams(tenant, run_id, cursor), count=count, block=block_ms)
    return _entries(reply, tenant, run_id)


def length(client: redis.Redis, tenant: str, run_id: str) -> int:
    """How many entries the run's live stream holds now (its bound, near enough)."""
    return int(client.xlen(keys.live(tenant, run_id)))
