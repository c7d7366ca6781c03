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
from turnstile.worker.ops.subjects import Subject, check_known, scan, tenants
from turnstile.worker.scheduling.priority import DEFAULT as DEFAULT_PRIORITY
from turnstile.worker.scheduling.priority import stored_priority
from turnstile.worker.store import keys
from turnstile.worker.store.values import text


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
        usage = msgspec.to_builtins(RunState.from_json(stored["state"]).usage)
    return RunRow(
        run_id, tenant, stored.get("status", ""), stored.get("outcome", ""),
        stored.get("detail", ""), stored.get("queue", ""), stored.get("job", ""),
        stored.get("user", ""), int(stored.get("created_ms") or 0),
        int(stored.get("updated_ms") or 0), usage.get("steps"), usage.get("tokens"),
        usage.get("cost_microusd"), stored.get("reason", ""),
        stored_priority(stored.get("priority")),
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
Bound = tuple[int, str]  # (created ms, run id) within one tenant: entries below it come next

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


def _chunk(c: Client, tenant: str, bound: Bound | None, n: int) -> list[Bound]:
    """Up to n of the tenant's runs below `bound`, newest first, from its runs index."""
    key = keys.runs(tenant)
    if bound is None:
        raw: list[Any] = c.client.zrevrangebyscore(
            key, "+inf", "-inf", start=0, num=n, withscores=True
        )
        return [(int(score), text(m)) for m, score in raw]
    ms, run_id = bound
    ties = sorted((text(m) for m in c.client.zrangebyscore(key, ms, ms)), reverse=True)
    older: list[Any] = c.client.zrevrangebyscore(
        key, f"({ms}", "-inf", start=0, num=n, withscores=True
    )
    out = [(ms, m) for m in ties if m < run_id] + [(int(sc), text(m)) for m, sc in older]
    return out[:n]


def _members(c: Client, sets: list[str], ids: list[str]) -> list[bool]:
    """Whether each id is in every one of `sets`."""
    keep = [True] * len(ids)
    for key in sets:
        flags = c.client.smismember(key, ids) if ids else []
        keep = [k and bool(f) for k, f in zip(keep, flags, strict=True)]
    return keep


@dataclass
class _Found:
    entries: list[Key]  # matching runs of the tenant, newest first, at most the page's size
    stopped_at: Key | None = None  # a walk that ran out of budget: nothing below is known


def _walk(c: Client, tenant: str, sets: list[str], bound: Bound | None, want: int) -> _Found:
    found = _Found([])
    examined = 0
    while examined < WALK_BUDGET:
        chunk = _chunk(c, tenant, bound, WALK_CHUNK)
        if not chunk:
            return found
        keep = _members(c, sets, [r for _, r in chunk])
        for entry, matches in zip(chunk, keep, strict=True):
            bound = entry
            if matches:
                found.entries.append((entry[0], tenant, entry[1]))
                if len(found.entries) == want:
                    return found
        examined += len(chunk)
    if bound is not None:
        found.stopped_at = (bound[0], tenant, bound[1])
    return found


def _small(c: Client, tenant: str, sets: list[str], bound: Bound | None, want: int) -> _Found:
    """Read the smallest filter index whole (in slices) and order it by creation."""
    smallest, *others = sorted(sets, key=lambda k: int(c.client.scard(k)))
    ids = sorted({run_id for part in scan(c, smallest) for run_id in part})
    ids = [r for r, k in zip(ids, _members(c, others, ids), strict=True) if k]
    scores = c.client.zmscore(keys.runs(tenant), ids) if ids else []
    entries = sorted(
        (
            (int(score), run_id)
            for run_id, score in zip(ids, scores, strict=True)
            if score is not None
        ),
        reverse=True,
    )
    below = [e for e in entries if bound is None or e < bound]
    return _Found([(ms, tenant, run_id) for ms, run_id in below[:want]])


def _filter_sets(tenant: str, status: str | None, outcome: str | None) -> list[str]:
    sets = [keys.by_status(tenant, status)] if status else []
    return sets + ([keys.by_outcome(tenant, outcome)] if outcome else [])


def _candidates(c: Client, tenant: str, sets: list[str], after: Key | None, want: int) -> _Found:
    bound = _bound(after, tenant)
    if sets and min(int(c.client.scard(k)) for k in sets) <= SMALL_INDEX:
        return _small(c, tenant, sets, bound, want)
    return _walk(c, tenant, sets, bound, want)


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
        found = _candidates(c, t, _filter_sets(t, status, outcome), after, limit + 1)
        entries += found.entries
        stops += [found.stopped_at] if found.stopped_at else []
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
    pipe = c.client.pipeline(transaction=False)
    for _, t, run_id in page:
        pipe.hgetall(keys.run(t, run_id))
    out = []
    for (_, t, run_id), raw in zip(page, pipe.execute(), strict=True):
        stored = {text(k): text(v) for k, v in raw.items()}
        if stored.get("status") and status in (None, stored["status"]):
            out.append(_row(t, run_id, stored))
    return out
