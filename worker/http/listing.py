"""`GET /v1/runs` over the one run listing (`worker.ops.listing`, the one `turnstile runs`
pages with): the same pages, order and cursors, with the HTTP answers to bad input. A filter
that names no status or outcome is a 422 `invalid_filter`; a cursor that is not one this
tenant's listing gave is a 400 `invalid_cursor`; a tenant with no runs has an empty page.
"""

from __future__ import annotations

from turnstile.worker.client._client import Client
from turnstile.worker.http.problems import Problem
from turnstile.worker.ops import listing
from turnstile.worker.ops.errors import ControlError
from turnstile.worker.ops.listing import RunsPage


def check_cursor(cursor: str, tenant: str) -> None:
    """A cursor this tenant's listing could have given: strictly parsed, and naming a place
    among the tenant's own runs (a page of one tenant never ends on another's run)."""
    try:
        _, named, _ = listing.decode_cursor(cursor)
    except ControlError:
        raise Problem(400, "invalid_cursor", "the cursor is not one this listing gave") from None
    if named != tenant:
        raise Problem(400, "invalid_cursor", "the cursor is not one this listing gave")


def page(
    c: Client, tenant: str, *, status: str | None, outcome: str | None, cursor: str | None,
    limit: int,
) -> RunsPage:  # fmt: skip
    try:
        listing.check_filter(status, outcome)
    except ControlError as exc:
        raise Problem(422, "invalid_filter", str(exc)) from None
    cursor = cursor or None  # `?cursor=` (a null next_cursor sent back): the first page
    if cursor is not None:
        check_cursor(cursor, tenant)
    found, next_cursor = listing.page_keys(
        c, tenant=tenant, status=status, outcome=outcome, limit=limit, cursor=cursor
    )
    return RunsPage(listing.rows(c, found, status), next_cursor)
