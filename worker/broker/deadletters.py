"""Dead letters: what a worker takes off its queue and cannot run, kept with the reason.

A queue on the Redis broker is a list that anyone with the server can push to, so a worker may
read an entry that is not a message it can run. The worker's broker connection (transport.py,
intake.py) hands every such entry here instead of dying on it. Each dead letter is one log line
(`message_dead_lettered`), one count in the worker's metrics
(`turnstile_dead_letters_total{reason}`) and one entry in the queue's list of dead letters
(worker/store/deadletters.py: newest first, the newest `MAX_KEPT` kept); `turnstile
dead-letters list|drop` reads and removes them.
A step whose envelope is fine but whose arguments are not is the step task's business: it
ends the named run `error` (`malformed_step_message` in worker/runtime/task.py).
"""

from __future__ import annotations

import base64
import json
import uuid
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from enum import StrEnum

import redis
import structlog

from turnstile.errors import TurnstileError
from turnstile.worker.observability import metrics
from turnstile.worker.store import deadletters as kept

log = structlog.get_logger("turnstile.deadletters")

MAX_KEPT = 10_000  # per queue: a flood of garbage cannot fill the broker's memory
MAX_RAW_BYTES = 64 * 1024  # of each entry; the size of the whole is recorded
MAX_DETAIL_CHARS = 300


class Reason(StrEnum):
    NOT_JSON = "not_json"  # the queue entry is not JSON at all
    BAD_ENVELOPE = "bad_envelope"  # JSON, but not kombu's envelope (properties, tag, body)
    BAD_BODY = "bad_body"  # the body does not decode with its content type
    BAD_HEADERS = "bad_headers"  # Celery headers of the wrong types
    UNKNOWN_FORMAT = "unknown_format"  # neither Celery protocol 1 nor 2
    UNKNOWN_TASK = "unknown_task"  # a task name this worker does not have
    INVALID_TASK = "invalid_task"  # Celery refused it (InvalidTaskError, content disallowed)
    UNHANDLED = "unhandled"  # anything else that raised while the message was taken in


@dataclass(frozen=True)
class DeadLetter:
    id: str
    at: str  # ISO time, UTC
    queue: str
    reason: str  # a Reason
    detail: str
    size_bytes: int
    raw: str  # the entry as text, or base64 of its bytes when they are not UTF-8
    raw_encoding: str  # "text" or "base64"
    truncated: bool  # raw holds only the first MAX_RAW_BYTES


def _raw_fields(raw: bytes | str) -> tuple[int, str, str, bool]:
    data = raw.encode("utf-8", "surrogateescape") if isinstance(raw, str) else raw
    kept = data[:MAX_RAW_BYTES]
    try:
        return len(data), kept.decode("utf-8"), "text", len(kept) < len(data)
    except UnicodeDecodeError:
        return len(data), base64.b64encode(kept).decode("ascii"), "base64", len(kept) < len(data)


def make(queue: str, reason: Reason, detail: str, raw: bytes | str) -> DeadLetter:
    size, text, encoding, truncated = _raw_fields(raw)
    return DeadLetter(
        id=uuid.uuid4().hex[:16],
        at=datetime.now(UTC).isoformat(timespec="milliseconds"),
        queue=queue,
        reason=reason.value,
        detail=detail[:MAX_DETAIL_CHARS],
        size_bytes=size,
        raw=text,
        raw_encoding=encoding,
        truncated=truncated,
    )


def record(client: redis.Redis | None, letter: DeadLetter) -> None:
    """Keep the dead letter on the broker; log it (one line) and count it whether or not that
    worked. If it could not be kept, the line carries the start of the entry instead."""
    lost: dict[str, str] = {}
    try:
        if client is None:
            raise redis.ConnectionError("not a Redis broker")
        kept.keep(client, letter.queue, json.dumps(asdict(letter)), MAX_KEPT)
    except redis.RedisError as exc:  # the broker went away mid-read
        lost = {"not_kept": str(exc), "raw": letter.raw[:2000]}
    log.error(
        "message_dead_lettered", queue=letter.queue, reason=letter.reason, detail=letter.detail,
        id=letter.id, size_bytes=letter.size_bytes, kept=not lost, **lost,
    )  # fmt: skip
    metrics.message_dead_lettered(letter.reason)


# -- reading and removing (the CLI, `turnstile queues`) ----------------------------------------


def queues(client: redis.Redis) -> list[str]:
    return kept.queues(client)


def _parse(entry: bytes | str) -> DeadLetter | None:
    try:
        return DeadLetter(**json.loads(entry))
    except (TypeError, ValueError):
        return None


def listing(client: redis.Redis, queue: str | None = None, limit: int = 100) -> list[DeadLetter]:
    """The newest `limit` dead letters of one queue, or of every queue, newest first."""
    out: list[DeadLetter] = []
    for name in [queue] if queue is not None else queues(client):
        out.extend(d for d in map(_parse, kept.newest(client, name, limit)) if d is not None)
    return sorted(out, key=lambda d: d.at, reverse=True)[:limit]


class DeadLetterNotFoundError(TurnstileError):
    """A dead letter named by id is not there; nothing was dropped."""


def drop(client: redis.Redis, *, queue: str | None = None, ids: list[str] | None = None) -> int:
    """Remove the dead letters with these ids (in `queue` or any; all of them or none), or,
    without ids, every dead letter of `queue` (or of every queue). Returns how many went."""
    names = [queue] if queue is not None else queues(client)
    if ids is None:
        return sum(kept.drop_all(client, name) for name in names)
    found: dict[str, tuple[str, str]] = {}
    for name in names:
        for entry in kept.newest(client, name):
            parsed = _parse(entry)
            if parsed is not None and parsed.id in ids:
                found[parsed.id] = (name, entry)
    missing = [i for i in ids if i not in found]
    if missing:
        raise DeadLetterNotFoundError(f"no dead letter {', '.join(missing)}; nothing dropped")
    return sum(kept.drop(client, name, entry) for name, entry in found.values())
