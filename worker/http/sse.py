"""A run's events as Server-Sent Events, read back from its Redis stream.

What is sent is what is stored, in the stored order: each event's `id:` is its stream entry
id and its `data:` the stored JSON, unchanged. A client that reconnects with `Last-Event-ID`
gets exactly the entries after that id (XREAD is exclusive of the id it is given), so nothing
is lost or repeated. The stream closes after the `finished` event; a run that is already
stopped, resumed past its `finished` event, closes at once.
"""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator
from typing import Protocol

import msgspec
import redis
import redis.asyncio as aioredis

from turnstile.jobs.outcomes import Status
from turnstile.worker.http.problems import Problem
from turnstile.worker.store import follow, live
from turnstile.worker.store.live import Cursor

# ASCII digits only (`\d` takes any script's digits), each part at most a uint64, as a
# stream id is: anything else would be refused by the store after the stream had begun.
EVENT_ID = re.compile(r"([0-9]{1,20})-([0-9]{1,20})")
UINT64_MAX = 2**64 - 1
BATCH = 200


def check_event_id(value: str | None) -> str:
    """The stream id to read after: "0-0" (from the start) for none, else exactly what a
    stream's `id:` could be; 400 for anything else, before any of the stream is sent."""
    if value is None or value == "":
        return "0-0"
    parts = EVENT_ID.fullmatch(value)
    if not parts or any(int(p) > UINT64_MAX for p in parts.groups()):
        raise Problem(400, "invalid_event_id", "Last-Event-ID must be a stream id like 1700-0")
    return value


def check_cursor(value: str | None) -> Cursor:
    """Where a live stream resumes: the id a live stream's frame carried (`<event id>/<live
    id>`), or an event id alone (a plain stream's: the live entries from the first); 400 for
    anything else, before any of the stream is sent."""
    if value is None or value == "":
        return Cursor()
    cursor = Cursor.parse(value)
    if cursor is None or any(
        int(p) > UINT64_MAX for part in (cursor.events, cursor.live) for p in part.split("-")
    ):
        raise Problem(
            400, "invalid_event_id",
            "Last-Event-ID must be a live stream's id like 1700-0/1701-3, or a stream id",
        )  # fmt: skip
    return cursor


def frame(entry_id: str, kind: str, data: str) -> str:
    # Stored events are single-line JSON (msgspec escapes newlines), one data line each.
    return f"id: {entry_id}\nevent: {kind}\ndata: {data}\n\n"


class _Typed(msgspec.Struct):
    type: str = "message"


def _kind(data: str) -> str:
    """The event's top-level `type` (its SSE event name); the rest is not decoded."""
    try:
        kind = msgspec.json.decode(data, type=_Typed).type
    except (msgspec.ValidationError, msgspec.DecodeError):
        return "message"
    return kind if re.fullmatch(r"[a-z_]{1,40}", kind) else "message"


class Renewal(Protocol):
    """The stream's place under its key's cap (worker/http/streams.py)."""

    async def renew(self) -> None: ...

    async def close(self) -> None: ...


async def stream(
    r: aioredis.Redis, tenant: str, run_id: str, *, after: str, block_ms: int, slot: Renewal
) -> AsyncIterator[str]:
    """SSE frames of the run's events after `after`, live, until its `finished` event. Async,
    so a client following a quiet run holds a connection, not one of the server's threads.
    If the store goes away mid-stream, an `error` event ends it; the client resumes later
    with Last-Event-ID. The stream's `slot` is renewed as it reads and given back at its end."""
    frames = _frames(r, tenant, run_id, after=after, block_ms=block_ms, slot=slot)
    async for chunk in _ended(frames, block_ms=block_ms, slot=slot):
        yield chunk


async def live_stream(
    r: aioredis.Redis, tenant: str, run_id: str, *, after: Cursor, block_ms: int, slot: Renewal
) -> AsyncIterator[str]:
    """`stream`, with the run's live output between its events (`?live=1`): each frame's
    `id:` is the cursor over both streams after it (`<event id>/<live id>`), so a client that
    reconnects with it as Last-Event-ID gets exactly what came after, in the middle of a turn
    too. A live entry's data carries `"live": true`; the committed `turn` event is the truth."""
    frames = _live_frames(r, tenant, run_id, after, block_ms=block_ms, slot=slot)
    async for chunk in _ended(frames, block_ms=block_ms, slot=slot):
        yield chunk


async def _ended(frames: AsyncIterator[str], *, block_ms: int, slot: Renewal) -> AsyncIterator[str]:
    """A stream's frames after its `retry:` line, ended by an `error` event when the store goes
    away or refuses the read, and its slot given back however it ends."""
    try:
        yield f"retry: {min(block_ms, 3000)}\n\n"
        async for chunk in frames:
            yield chunk
    except (redis.ConnectionError, redis.TimeoutError):
        yield 'event: error\ndata: {"code":"store_unavailable"}\n\n'
    except redis.ResponseError:
        # The id was checked before the stream began, so this is not the client's; still an
        # event that says the stream ended, never a dropped connection.
        yield 'event: error\ndata: {"code":"stream_refused"}\n\n'
    finally:
        await slot.close()


async def _live_frames(
    r: aioredis.Redis, tenant: str, run_id: str, cursor: Cursor, *, block_ms: int, slot: Renewal
) -> AsyncIterator[str]:
    checked = False  # the run was seen stopped: one more read, then the end
    watched_at = 0.0
    while True:
        if time.monotonic() - watched_at >= 1.0:  # a turn that starts now writes its output
            watched_at = time.monotonic()
            await live.watch_async(r, tenant, run_id)
        block = None if checked else block_ms
        entries = await live.read_async(r, tenant, run_id, cursor, count=BATCH, block_ms=block)
        await slot.renew()
        for entry in entries:
            cursor = cursor.past(entry)
            kind = entry.type if re.fullmatch(r"[a-z_]{1,40}", entry.type) else "message"
            yield frame(str(cursor), kind, entry.raw)
            if kind == "finished" and not entry.live:
                return
        if entries:
            continue
        if checked:
            return
        # As `_frames`: a run seen stopped has its `finished` event stored already.
        if await follow.status(r, tenant, run_id) in (None, Status.STOPPED.value):
            checked = True
            continue
        yield ": still running\n\n"


async def _frames(
    r: aioredis.Redis, tenant: str, run_id: str, *, after: str, block_ms: int, slot: Renewal
) -> AsyncIterator[str]:
    last = after
    while True:
        entries = await follow.after(r, tenant, run_id, last, count=BATCH, block_ms=block_ms)
        await slot.renew()
        for entry_id, data in entries:
            last = entry_id
            kind = _kind(data)
            yield frame(last, kind, data)
            if kind == "finished":
                return
        if entries:
            continue
        # Quiet for a whole block. The commit writes a run's status and its events in one
        # script, so a run seen stopped now has its `finished` event in the stream already:
        # one more read either sends it or finds it was before `after`.
        if await follow.status(r, tenant, run_id) in (None, Status.STOPPED.value):
            for entry_id, data in await follow.after(r, tenant, run_id, last, count=BATCH):
                yield frame(entry_id, _kind(data), data)
            return
        yield ": still running\n\n"
