"""Turn the scripts' structured replies into typed results.

The scripts answer refusals as data ({'conflict'}, {'invalid', message}, ...), never as Redis
errors, so a refusal and a broken server cannot be confused.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from turnstile.ledger.errors import (
    LedgerConflict,
    LedgerInputError,
    LedgerProtocolError,
    LedgerUnknownReservation,
)
from turnstile.ledger.inputs import Period, in_dimension_order
from turnstile.ledger.results import (
    CeilingResult,
    Change,
    DimensionState,
    JournalEntry,
    RebuildResult,
    Rejection,
    ReserveResult,
    SettleResult,
)


def text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, str):
        return value
    raise LedgerProtocolError(f"expected a string in the reply, got {value!r}")


def integer(value: object) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str | bytes):
        return int(value)
    raise LedgerProtocolError(f"expected an integer in the reply, got {value!r}")


def _items(value: object) -> Sequence[object]:
    if not isinstance(value, list | tuple):
        raise LedgerProtocolError(f"expected a list in the reply, got {value!r}")
    return value


def _checked(reply: object) -> Sequence[object]:
    """The reply's items, after raising for an {'invalid', message} refusal."""
    items = _items(reply)
    if items and isinstance(items[0], str | bytes) and text(items[0]) == "invalid":
        raise LedgerInputError(f"refused by the server: {text(items[1])}")
    return items


def _status(reply: object) -> tuple[str, Sequence[object]]:
    items = _checked(reply)
    if not items:
        raise LedgerProtocolError("empty reply")
    return text(items[0]), items


def reserve(reply: object) -> ReserveResult:
    status, items = _status(reply)
    if status == "admitted":
        return ReserveResult(
            status="admitted",
            admitted=True,
            expires_at_ms=integer(items[1]),
            replayed=integer(items[2]) == 1,
            soft_exceeded=tuple(text(d) for d in _items(items[3])),
        )
    if status == "rejected":
        flat = _items(items[1])
        rejected = tuple(
            Rejection(
                dimension=text(flat[i]),
                requested=integer(flat[i + 1]),
                available=integer(flat[i + 2]),
            )
            for i in range(0, len(flat), 3)
        )
        return ReserveResult(
            status="rejected",
            admitted=False,
            rejected=rejected,
            soft_exceeded=tuple(text(d) for d in _items(items[2])),
        )
    if status == "conflict":
        return ReserveResult(
            status="conflict",
            admitted=False,
            detail="this reservation id was admitted before with other amounts",
        )
    raise LedgerProtocolError(f"unexpected reserve reply {reply!r}")


def needs_index(reply: object) -> bool:
    """Whether an admitted reserve asks its caller to add the tenant to the reaper's set."""
    items = _items(reply)
    return text(items[0]) == "admitted" and integer(items[4]) == 1


def settle(reply: object, reservation_id: str) -> SettleResult:
    status, items = _status(reply)
    if status == "settled":
        flat = _items(items[2])
        return SettleResult(
            replayed=integer(items[1]) == 1,
            overage={text(flat[i]): integer(flat[i + 1]) for i in range(0, len(flat), 2)},
            corrected=integer(items[3]) == 1,
        )
    if status == "conflict":
        raise LedgerConflict(
            f"reservation {reservation_id!r} was already resolved with a different actual"
        )
    if status == "unknown":
        raise LedgerUnknownReservation(f"no reservation {reservation_id!r}")
    raise LedgerProtocolError(f"unexpected settle reply {reply!r}")


def set_ceiling(reply: object, op_id: str) -> CeilingResult:
    status, items = _status(reply)
    if status == "set":
        return CeilingResult(op_id=op_id, replayed=integer(items[1]) == 1)
    if status == "conflict":
        raise LedgerConflict(f"operation {op_id!r} already set a different ceiling")
    raise LedgerProtocolError(f"unexpected set_ceiling reply {reply!r}")


def read(reply: object) -> dict[str, DimensionState]:
    """Rows keyed by dimension, in dimension order."""
    rows: dict[str, DimensionState] = {}
    for row in _checked(reply):
        name, ceiling, hard, period, bucket, committed, reserved = _items(row)
        rows[text(name)] = DimensionState(
            ceiling=None if text(ceiling) == "-" else integer(ceiling),
            hard=integer(hard) == 1,
            period=Period(text(period)),
            bucket=text(bucket),
            committed=integer(committed),
            reserved=integer(reserved),
        )
    return {name: rows[name] for name in in_dimension_order(rows)}


def reap(reply: object) -> tuple[int, int, int]:
    """(expired, pruned, pending)"""
    items = _checked(reply)
    return integer(items[0]), integer(items[1]), integer(items[2])


def checked(reply: object) -> Sequence[object]:
    """The reply's items, after raising for an {'invalid', message} refusal."""
    return _checked(reply)


def buckets(reply: object) -> tuple[str, ...]:
    """A list of period bucket names (prune.lua)."""
    return tuple(text(b) for b in _checked(reply))


def rebuild(reply: object) -> RebuildResult:
    items = _checked(reply)
    return RebuildResult(pending=integer(items[0]), corrected_fields=integer(items[1]))


_ENTRY_HEAD = ("op", "id", "at_ms", "changes")


def _changes(text_: str) -> tuple[Change, ...]:
    """Parse a journal entry's changes: "<dim>@<bucket>:<committed delta>:<reserved delta>;..."."""
    changes = []
    for part in filter(None, text_.split(";")):
        where, committed, reserved = part.rsplit(":", 2)
        dimension, bucket = where.split("@", 1)
        changes.append(
            Change(
                dimension=dimension,
                bucket=bucket,
                committed_delta=int(committed),
                reserved_delta=int(reserved),
            )
        )
    return tuple(changes)


def journal_entry(entry_id: object, raw: Mapping[Any, object]) -> JournalEntry:
    fields = {text(k): text(v) for k, v in raw.items()}
    return JournalEntry(
        entry_id=text(entry_id),
        op=fields["op"],
        id=fields["id"],
        at_ms=int(fields["at_ms"]),
        changes=_changes(fields.get("changes", "")),
        fields={k: v for k, v in fields.items() if k not in _ENTRY_HEAD},
    )
