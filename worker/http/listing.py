"""Pages of a tenant's runs, newest first, by the same listing `turnstile runs` pages with
(`worker.control.page_keys`): with a status or an outcome, the filter's index is read and
ordered by creation time (or, for a big one, the tenant's runs are walked newest first and
checked against it); a page has exactly `limit` runs at most, and its cursor names the last
run's place (created ms, tenant, id), so a run created since does not shift a page. Only the
page's runs are loaded, a few fields each.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis

from turnstile.jobs.outcomes import Outcome, Status
from turnstile.worker.client._client import Client
from turnstile.worker.http.problems import Problem
from turnstile.worker.ops import listing
from turnstile.worker.ops.errors import ControlError
from turnstile.worker.store import keys

FIELDS = ("status", "outcome", "detail", "queue", "job", "user", "created_ms", "updated_ms")


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


def check_cursor(cursor: str, tenant: str) -> None:
    """A cursor this tenant's listing could have given: strictly parsed, and naming a place
    among the tenant's own runs (a page of one tenant never ends on another's run)."""
    try:
        _, named, _ = listing.decode_cursor(cursor)
    except ControlError:
        raise Problem(400, "invalid_cursor", "the cursor is not one this listing gave") from None
    if named != tenant:
        raise Problem(400, "invalid_cursor", "the cursor is not one this listing gave")


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


def page(
    c: Client, tenant: str, *, status: str | None, outcome: str | None, cursor: str | None,
    limit: int,
) -> Page:  # fmt: skip
    _check(status, outcome)
    cursor = cursor or None  # `?cursor=` (a null next_cursor sent back): the first page
    if cursor is not None:
        check_cursor(cursor, tenant)
    found, next_cursor = listing.page_keys(
        c, tenant=tenant, status=status, outcome=outcome, limit=limit, cursor=cursor
    )
    return Page(_rows(c.client, tenant, [run_id for _, _, run_id in found], status), next_cursor)
