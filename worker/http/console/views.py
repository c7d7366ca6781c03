"""What each console page shows, assembled from the operator library (worker/ops) and the
ledger: the same reads `turnstile` and the JSON API make, shaped for a template."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import msgspec

from turnstile.errors import RunNotFoundError
from turnstile.jobs.errors import StateFormatError
from turnstile.jobs.state import RunState
from turnstile.ledger import replies
from turnstile.ledger.keys import journal_key
from turnstile.worker.client._client import Client
from turnstile.worker.http.listing import check_cursor
from turnstile.worker.ops import decisions, listing, queues, subjects, views
from turnstile.worker.ops import versions as job_versions
from turnstile.worker.ops.listing import RunRow
from turnstile.worker.store import controls, fields, run_index
from turnstile.worker.store.values import text

# A filter by job is applied to the listing's pages as they come (runs have no job index):
# a page examines at most this many runs, then says more may match further on.
JOB_SCAN = 5_000
HISTORY_SCAN = 20_000  # journal entries read, newest first, for the ceilings' history
HISTORY_ROWS = 20
BUDGET_ROWS = (  # (what, used in the usage, its ceiling in the run's budget)
    ("steps", "steps", "max_steps"),
    ("tool calls", "tool_calls", "max_tool_calls"),
    ("tokens", "tokens", "max_tokens"),
    ("active time (ms)", "elapsed_ms", "deadline_ms"),
    ("cost (µ$)", "cost_microusd", "max_cost_microusd"),
)


def shown(value: Any) -> str:
    """A stored value as text: strings as they are, anything else as indented JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)


def compact(value: Any) -> str:
    """A stored value on one line: strings as they are, anything else as JSON."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def gauge(used: int | None, ceiling: int | None) -> int | None:
    """Percent of the ceiling used (capped at 100 for the bar), None without a ceiling."""
    if used is None or not ceiling:
        return None
    return min(100, round(100 * used / ceiling))


# -- runs ------------------------------------------------------------------------------------


@dataclass
class RunsPage:
    rows: list[RunRow]
    next_cursor: str | None
    examined_all: bool = True  # False: a job filter stopped at JOB_SCAN runs


def runs_page(
    c: Client, *, tenant: str | None, status: str | None, outcome: str | None,
    job: str | None, cursor: str | None, limit: int,
) -> RunsPage:  # fmt: skip
    """A page of runs, newest first, through the one listing (worker/ops/listing.py); with a
    job, the listing's pages are read until `limit` runs of that job are found."""
    listing.check_filter(status, outcome)
    if cursor and tenant is not None:
        check_cursor(cursor, tenant)
    if not job:
        got, next_cursor = listing.page_keys(
            c, tenant=tenant, status=status, outcome=outcome, limit=limit, cursor=cursor
        )
        return RunsPage(listing.rows(c, got, status), next_cursor)
    found: list[RunRow] = []
    examined = 0
    while examined < JOB_SCAN:
        got, next_cursor = listing.page_keys(
            c, tenant=tenant, status=status, outcome=outcome, limit=limit, cursor=cursor
        )
        examined += len(got)
        for row in listing.rows(c, got, status):
            if row.job == job:
                found.append(row)
                if len(found) == limit:
                    last = (row.created_ms, row.tenant, row.run_id)
                    return RunsPage(found, listing.encode_cursor(last))
        if next_cursor is None:
            return RunsPage(found, None)
        cursor = next_cursor
    return RunsPage(found, cursor, examined_all=False)


# -- one run ---------------------------------------------------------------------------------


@dataclass
class Turn:
    step: Any
    at: str
    status: str
    model: str
    fallback: str
    model_status: str
    reply: Any
    tokens: Any
    calls: list[dict[str, Any]]
    observation: Any
    spans: list[dict[str, Any]]
    eager: bool


def _ms(span: dict[str, Any]) -> float | None:
    t0, t1 = span.get("t0"), span.get("t1")
    return None if t1 is None or t0 is None else round((t1 - t0) * 1000, 1)


def _span_status(span: dict[str, Any]) -> str:
    """A span's status and, when it did not end ok, why in words."""
    attrs = span.get("attrs") or {}
    reply = attrs.get("reply")
    if isinstance(reply, dict) and reply.get("type") == "malformed":
        return f"malformed: {reply.get('problem')}"
    status = str(span.get("status", ""))
    why = attrs.get("detail") or attrs.get("error") or attrs.get("reason")
    return f"{status}: {why}" if why and status not in ("ok", "open") else status


def turn_of(event: dict[str, Any]) -> Turn:
    spans = [s for s in event.get("spans") or [] if isinstance(s, dict)]
    model = next((s for s in spans if s.get("kind") == "model"), {})
    attrs = model.get("attrs") or {}
    calls = [
        {"name": s.get("name"), "args": (s.get("attrs") or {}).get("args"),
         "status": _span_status(s), "ok": s.get("status") == "ok", "ms": _ms(s)}
        for s in spans if s.get("kind") == "tool"
    ]  # fmt: skip
    return Turn(
        step=event.get("step"), at=str(event.get("at", "")), status=str(event.get("status", "")),
        # A provider's model names itself; a scripted one is known by its span's name.
        model=str(event.get("model") or attrs.get("model") or model.get("name") or ""),
        fallback=str(event.get("fallback") or ""),
        model_status=_span_status(model) if model else "",
        reply=attrs.get("reply"), tokens=(event.get("usage") or {}).get("tokens"),
        calls=calls, observation=event.get("last_result"),
        spans=[{"id": s.get("id"), "kind": s.get("kind"), "name": s.get("name"),
                "status": _span_status(s), "ms": _ms(s)} for s in spans],
        eager=bool(event.get("eager")),
    )  # fmt: skip


@dataclass
class RunPage:
    view: dict[str, Any]
    goal: str
    plan: list[dict[str, Any]]
    budget: list[dict[str, Any]]
    timeline: list[dict[str, Any]]  # every event: a turn, or another event's fields
    last_event_id: str


def run_page(c: Client, run_id: str, tenant: str) -> RunPage:
    view = views.run_view(c, run_id, tenant)
    _, stored = decisions.resolve(c, run_id, tenant)
    state = RunState.from_json(stored[fields.STATE])
    usage, budget = view["usage"], view["budget"]
    rows = [
        {"what": what, "used": usage.get(used), "ceiling": budget.get(ceiling),
         "percent": gauge(usage.get(used), budget.get(ceiling))}
        for what, used, ceiling in BUDGET_ROWS
    ] + [
        {"what": name, "used": value, "ceiling": None, "percent": None}
        for name, value in sorted((usage.get("extra") or {}).items())
    ]  # fmt: skip
    stream = views.events(c, tenant, run_id)
    timeline = []
    for entry_id, event in stream:
        if event.get("type") == "turn":
            timeline.append({"id": entry_id, "type": "turn", "turn": turn_of(event)})
        else:
            rest = {k: v for k, v in event.items() if k not in ("type", "at")}
            timeline.append({"id": entry_id, "type": event.get("type"), "at": event.get("at", ""),
                             "fields": rest})  # fmt: skip
    plan = [{"id": s.id, "tool": s.tool, "depends_on": s.depends_on, "status": s.status}
            for s in state.plan]  # fmt: skip
    return RunPage(view, state.goal, plan, rows, timeline, stream[-1][0] if stream else "0-0")


# -- the approvals inbox ---------------------------------------------------------------------


KINDS = {"call": "tool call", "budget": "budget extension"}  # a held decision's kind, in words


@dataclass
class Held:
    row: RunRow
    goal: str
    pending: dict[str, Any]  # the held decision's stored fields, whatever its kind
    kind: str  # what it is, in words


def inbox(
    c: Client, *, tenant: str | None, cursor: str | None, limit: int
) -> tuple[list[Held], str | None]:
    """Every suspended run (of one tenant, or every tenant's), newest first, with the decision
    it holds as `run_view` shows it: a new kind of held decision shows with its own fields."""
    if cursor and tenant is not None:
        check_cursor(cursor, tenant)
    got, next_cursor = listing.page_keys(
        c, tenant=tenant, status="suspended", outcome=None, limit=limit, cursor=cursor
    )
    rows = listing.rows(c, got, "suspended")
    states = run_index.fields_of_runs(c.client, [(r.tenant, r.run_id) for r in rows], fields.STATE)
    out = []
    for row, (state_json,) in zip(rows, states, strict=True):
        try:
            view = views.run_view(c, row.run_id, row.tenant)
            goal = RunState.from_json(state_json).goal if state_json else ""
        except (RunNotFoundError, StateFormatError):
            continue  # gone since the index was read, or a state this code cannot read
        pending = view.get("pending")
        if not pending:
            continue  # decided since the index was read
        kind = str(pending.get("kind") or ("call" if "tool" in pending else "decision"))
        out.append(Held(row, goal, dict(pending), KINDS.get(kind, kind)))
    return out, next_cursor


# -- tenants ---------------------------------------------------------------------------------


@dataclass
class TenantView:
    name: str
    dimensions: list[dict[str, Any]]
    paused: str
    paused_by: str
    resumed_at: str
    resumed_by: str
    history: list[dict[str, Any]] = field(default_factory=list)
    history_complete: bool = True  # False: older entries than HISTORY_SCAN were not read


def ceiling_history(c: Client, tenant: str) -> tuple[list[dict[str, Any]], bool]:
    """The tenant's ceiling changes, newest first, from its ledger journal (read newest first
    in slices; at most HISTORY_SCAN entries, most of which are reservations)."""
    out: list[dict[str, Any]] = []
    key, upper, read = journal_key(tenant), "+", 0
    while read < HISTORY_SCAN and len(out) < HISTORY_ROWS:
        raw: Any = c.client.xrevrange(key, max=upper, count=1000)
        if not raw:
            return out, True
        read += len(raw)
        for entry_id, entry_fields in raw:
            entry = replies.journal_entry(entry_id, dict(entry_fields or {}))
            if entry.op == "set_ceiling":
                out.append({"at_ms": entry.at_ms, **entry.fields})
                if len(out) == HISTORY_ROWS:
                    return out, True
        upper = "(" + text(raw[-1][0])
    return out, read < HISTORY_SCAN


def tenant_view(c: Client, tenant: str) -> TenantView:
    dims = [
        {"name": name, **msgspec.to_builtins(s),
         "percent": gauge(s.committed + s.reserved, s.ceiling)}
        for name, s in c.ledger.read(tenant).items()
    ]  # fmt: skip
    paused, paused_by, resumed_at, resumed_by = controls.tenant_flags(c.client, tenant)
    history, complete = ceiling_history(c, tenant)
    return TenantView(tenant, dims, paused, paused_by, resumed_at, resumed_by, history, complete)


def tenant_views(c: Client, tenant: str | None) -> list[TenantView]:
    names = subjects.tenants(c) if tenant is None else [tenant]
    return [tenant_view(c, name) for name in names]


def queue_views(c: Client) -> list[queues.QueueView]:
    return queues.queues(c)


def version_views(c: Client) -> list[job_versions.VersionView]:
    """Each job version's live runs and the workers serving it (`turnstile jobs versions`)."""
    return job_versions.versions(c)
