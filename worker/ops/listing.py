"""The one run listing, for `turnstile runs` and `GET /v1/runs`: pages of runs, newest first,
one tenant's or every tenant's, by status or outcome.

With a filter, the filter's index is read and ordered by creation time (or, for a big one, the
tenant's runs are walked newest first and checked against it); a page has exactly `limit` runs
at most, and its cursor names the last run's place (created ms, tenant, id), so a run created
since does not shift a page. Only the page's runs are loaded.
"""

from __future__ import annotations

import base64
import contextlib
import re
from dataclasses import dataclass
from typing import Any

import msgspec

from turnstile.jobs.errors import StateFormatError
from turnstile.jobs.outcomes import Outcome, Status
from turnstile.jobs.state import RunState
from turnstile.worker.client._client import Client
from turnstile.worker.ops.errors import ControlError
from turnstile.worker.ops.subjects import Subject, check_known, tenants
from turnstile.worker.scheduling.priority import DEFAULT as DEFAULT_PRIORITY
from turnstile.worker.scheduling.priority import stored_priority
from turnstile.worker.store import fields, run_index


@dataclass(frozen=True)
class RunRow:
    """One run as a listing shows it, in `turnstile runs --json` and `GET /v1/runs` alike."""

    run_id: str
    tenant: str
    status: str
    outcome: str
    detail: str
    queue: str
    job: str
    user: str
    created_ms: int
    updated_ms: int
    steps: int | None
    tokens: int | None
    cost_microusd: int | None
    reason: str = ""  # the outcome in words, beside its code and detail
    priority: int = DEFAULT_PRIORITY  # 0-9, higher served first within its tenant's share


def _row(tenant: str, run_id: str, stored: dict[str, str]) -> RunRow:
    usage: dict[str, Any] = {}
    with contextlib.suppress(StateFormatError, KeyError):
        usage = msgspec.to_builtins(RunState.from_json(stored[fields.STATE]).usage)
    return RunRow(
        run_id, tenant, stored.get(fields.STATUS, ""), stored.get(fields.OUTCOME, ""),
        stored.get(fields.DETAIL, ""), stored.get(fields.QUEUE, ""), stored.get(fields.JOB, ""),
        stored.get(fields.USER, ""), int(stored.get(fields.CREATED_MS) or 0),
        int(stored.get(fields.UPDATED_MS) or 0), usage.get("steps"), usage.get("tokens"),
        usage.get("cost_microusd"), stored.get(fields.REASON, ""),
        stored_priority(stored.get(fields.PRIORITY)),
    )  # fmt: skip


def check_filter(status: str | None, outcome: str | None) -> None:
    if status is not None and status not in {s.value for s in Status}:
        raise ControlError(
            f"unknown status {status!r}; one of {', '.join(s.value for s in Status)}"
        )
    if outcome is not None and outcome not in {o.value for o in Outcome}:
        raise ControlError(
            f"unknown outcome {outcome!r}; one of {', '.join(o.value for o in Outcome)}"
        )


Key = tuple[int, str, str]
"""A run's place in a listing: (created ms, tenant, run id). Listings are newest first, that
is in descending key order, across tenants."""
Bound = run_index.Bound  # (created ms, run id) within one tenant: entries below it come next

PAGE_MAX = 10_000  # rows one page may ask for
SMALL_INDEX = 10_000
"""A filter's index up to this size (parked, suspended, running runs: the live ones) is read
whole in slices and sorted; a bigger one (stopped runs, an outcome) is walked in the tenant's
runs index instead, which such runs mostly fill."""
WALK_CHUNK = 200  # runs read per round trip on a walk
WALK_BUDGET = 5_000  # runs one page examines per tenant on a walk; then it may come back short
TOP_ID = "\U0010ffff"  # above every run id


@dataclass(frozen=True)
class RunsPage:
    """One page of a listing; `next_cursor` continues it, None when there is nothing more."""

    rows: list[RunRow]
    next_cursor: str | None


# url-safe base64, unpadded, of at most (ms, a tenant and a run id of 128 characters each, every
# one escaped to six in the JSON).
CURSOR = re.compile(r"[A-Za-z0-9_\-]{1,2200}")
MS_MAX = 2**53  # a creation time in ms, as a sorted set's score holds it exactly


def encode_cursor(key: Key) -> str:
    return base64.urlsafe_b64encode(msgspec.json.encode(list(key))).decode().rstrip("=")


def decode_cursor(text: str) -> Key:
    """The place a listing's `next_cursor` names, parsed strictly: url-safe base64 of JSON
    [ms, tenant, run id], the ms a whole number a score holds exactly, the names bounded."""
    bad = ControlError(f"bad cursor {text[:80]!r}: pass the next_cursor a listing gave")
    if not isinstance(text, str) or not CURSOR.fullmatch(text):
        raise bad
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        ms, tenant, run_id = msgspec.json.decode(raw, type=tuple[int, str, str], strict=True)
    except (ValueError, msgspec.DecodeError, msgspec.ValidationError):
        raise bad from None
    if not 0 <= ms <= MS_MAX or not 0 < len(tenant) <= 128 or not 0 < len(run_id) <= 128:
        raise bad
    return ms, tenant, run_id


def _bound(after: Key | None, tenant: str) -> Bound | None:
    """The first page of `tenant` after the global `after`, as a bound within the tenant."""
    if after is None:
        return None
    ms, cursor_tenant, run_id = after
    if tenant == cursor_tenant:
        return ms, run_id
    # Same created ms: a smaller tenant name comes later (all its ties are to come), a
    # bigger one earlier (none are).
    return (ms, TOP_ID) if tenant < cursor_tenant else (ms, "")


def _candidates(
    c: Client, tenant: str, *, status: str | None, outcome: str | None, after: Key | None,
    want: int,
) -> tuple[list[Key], Key | None]:  # fmt: skip
    """Up to `want` of the tenant's runs after `after` that match, newest first, and where a
    walk that ran out of budget stopped (None: it did not)."""
    found = run_index.matching(
        c.client, tenant, status=status, outcome=outcome, below=_bound(after, tenant),
        want=want, small_index=SMALL_INDEX, chunk=WALK_CHUNK, budget=WALK_BUDGET,
    )  # fmt: skip
    stop = found.stopped_at
    return ([(ms, tenant, run_id) for ms, run_id in found.entries],
            (stop[0], tenant, stop[1]) if stop else None)  # fmt: skip


def page_runs(
    c: Client,
    *,
    tenant: str | None = None,
    status: str | None = None,
    outcome: str | None = None,
    limit: int = 100,
    cursor: str | None = None,
) -> RunsPage:
    """One page of runs, newest first: with a tenant, only that tenant's; without one, every
    tenant's (an operator's view). Reads at most `limit` runs per tenant from its indexes (a
    filtered walk through many finished runs examines at most WALK_BUDGET, and may return a
    short page), then loads only the page's runs. `cursor` is a page's `next_cursor`."""
    if tenant is not None:
        check_known(c, Subject(tenant=tenant))
    page, next_cursor = page_keys(
        c, tenant=tenant, status=status, outcome=outcome, limit=limit, cursor=cursor
    )
    return RunsPage(rows(c, page, status), next_cursor)


def page_keys(
    c: Client,
    *,
    tenant: str | None,
    status: str | None,
    outcome: str | None,
    limit: int,
    cursor: str | None,
) -> tuple[list[Key], str | None]:
    """The places of a page's runs (exactly `limit` at most) and the cursor of the next page,
    without loading the runs. A tenant that has no runs has an empty page."""
    check_filter(status, outcome)
    if not 1 <= limit <= PAGE_MAX:
        raise ControlError(f"limit must be between 1 and {PAGE_MAX}")
    after = decode_cursor(cursor) if cursor else None
    entries: list[Key] = []
    stops: list[Key] = []
    for t in [tenant] if tenant is not None else tenants(c):
        found, stopped_at = _candidates(
            c, t, status=status, outcome=outcome, after=after, want=limit + 1
        )
        entries += found
        stops += [stopped_at] if stopped_at else []
    entries.sort(reverse=True)
    # Below the newest place a walk stopped, that tenant's runs are not known yet.
    stop = max(stops, default=None)
    known = [e for e in entries if stop is None or e >= stop]
    page = known[:limit]
    # One more than the page was asked of each tenant: a page with nothing after it says so.
    next_key = page[-1] if len(known) > limit else stop
    return page, encode_cursor(next_key) if next_key else None


def rows(c: Client, page: list[Key], status: str | None = None) -> list[RunRow]:
    """The page's runs, loaded in one round trip. A run gone since its index was read, or moved
    out of the `status` the page was asked for, is left out."""
    found = run_index.hashes(c.client, [(t, run_id) for _, t, run_id in page])
    out = []
    for (_, t, run_id), stored in zip(page, found, strict=True):
        if stored.get(fields.STATUS) and status in (None, stored[fields.STATUS]):
            out.append(_row(t, run_id, stored))
    return out
