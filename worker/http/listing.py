"""Pages of a tenant's runs, by cursor, never by reading everything.

With a status or an outcome, a page is one SSCAN step over the tenant's index set (`SSCAN`
returns every member present for the whole scan at least once; a run that changes status
mid-scan may be missed or seen twice, as the index it was in changed). Without a filter, pages
walk the tenant's runs newest first by creation time: the cursor is the last run's (ms, id),
and ties in one millisecond are broken by id, so a run created since does not shift a page.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis

from turnstile.jobs.outcomes import Outcome, Status
from turnstile.worker.http.problems import Problem
from turnstile.worker.store import keys

FIELDS = ("status", "outcome", "detail", "queue", "job", "user", "created_ms", "updated_ms")
SCAN_ROUNDS = 8  # SSCAN steps one page may take to fill, so a sparse set still answers quickly


@dataclass(frozen=True)
class Page:
    rows: list[dict[str, Any]]
    next_cursor: str | None


def _check(status: str | None, outcome: str | None) -> None:
    if status is not None and status not in {s.value for s in Status}:
        raise Problem(422, "invalid_filter", f"unknown status {status!r}; one of "
                      + ", ".join(s.value for s in Status))  # fmt: skip
    if outcome is not None and outcome not in {o.value for o in Outcome}:
        raise Problem(422, "invalid_filter", f"unknown outcome {outcome!r}; one of "
                      + ", ".join(o.value for o in Outcome))  # fmt: skip


def _rows(r: redis.Redis, tenant: str, ids: list[str], status: str | None) -> list[dict[str, Any]]:
    pipe = r.pipeline(transaction=False)
    for run_id in ids:
        pipe.hmget(keys.run(tenant, run_id), *FIELDS)
    out = []
    for run_id, values in zip(ids, pipe.execute(), strict=True):
        row = dict(zip(FIELDS, (v or "" for v in values), strict=True))
        if not row["status"] or (status is not None and row["status"] != status):
            continue  # gone, or moved out of the status since the index was read
        row.update(run_id=run_id, tenant=tenant, created_ms=int(row["created_ms"] or 0),
                   updated_ms=int(row["updated_ms"] or 0))  # fmt: skip
        out.append(row)
    return out


def _scan(r: redis.Redis, key: str, cursor: str, limit: int) -> tuple[list[str], str | None]:
    position = int(cursor[1:]) if cursor else 0
    found: list[str] = []
    for _ in range(SCAN_ROUNDS):
        position, batch = r.sscan(key, position, count=limit)
        found += [str(m) for m in batch]
        if position == 0 or len(found) >= limit:
            break
    return found, (None if position == 0 else f"s{position}")


def _newest(r: redis.Redis, tenant: str, cursor: str, limit: int) -> tuple[list[str], str | None]:
    key = keys.runs(tenant)
    entries: list[Any]
    if not cursor:
        entries = r.zrevrangebyscore(key, "+inf", "-inf", start=0, num=limit + 1, withscores=True)
    else:
        ms_text, _, last_id = cursor[1:].partition(":")
        ms = int(ms_text)
        same: list[Any] = r.zrevrangebyscore(key, ms, ms, withscores=True)
        older: list[Any] = r.zrevrangebyscore(
            key, f"({ms}", "-inf", start=0, num=limit + 1, withscores=True
        )
        entries = [(m, s) for m, s in same if str(m) < last_id] + older
    page = [(str(entry[0]), int(entry[1])) for entry in entries[:limit]]
    more = len(entries) > limit
    return [m for m, _ in page], (f"z{page[-1][1]}:{page[-1][0]}" if more and page else None)


def _check_cursor(cursor: str, filtered: bool) -> None:
    kind = "s" if filtered else "z"
    body = cursor[1:]
    ok = cursor.startswith(kind) and (
        body.isdigit() if filtered else body.partition(":")[0].isdigit() and ":" in body
    )
    if not ok or len(cursor) > 200:
        raise Problem(400, "invalid_cursor", "the cursor is not one this listing gave")


def page(
    r: redis.Redis, tenant: str, *, status: str | None, outcome: str | None, cursor: str | None,
    limit: int,
) -> Page:  # fmt: skip
    _check(status, outcome)
    filtered = status is not None or outcome is not None
    if cursor:
        _check_cursor(cursor, filtered)
    if outcome is not None:
        ids, nxt = _scan(r, keys.by_outcome(tenant, outcome), cursor or "", limit)
    elif status is not None:
        ids, nxt = _scan(r, keys.by_status(tenant, status), cursor or "", limit)
    else:
        ids, nxt = _newest(r, tenant, cursor or "", limit)
    return Page(_rows(r, tenant, list(dict.fromkeys(ids)), status), nxt)
