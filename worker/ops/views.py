"""One run as an operator reads it: `run_view` (what `turnstile status` and `GET /v1/runs/{id}`
show), its events, a live tail of them, and its trace's spans."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import msgspec

from turnstile.errors import TurnstileError
from turnstile.jobs.errors import StateFormatError
from turnstile.jobs.outcomes import Status
from turnstile.jobs.state import RunState
from turnstile.jobs.trace import Span
from turnstile.worker.client._client import Client
from turnstile.worker.client._room import call_charges, no_room
from turnstile.worker.ops.decisions import resolve
from turnstile.worker.scheduling.priority import stored_priority
from turnstile.worker.store import fields


def events(c: Client, tenant: str, run_id: str) -> list[tuple[str, dict[str, Any]]]:
    return c.store.events(tenant, run_id)


def run_view(c: Client, run_id: str, tenant: str | None = None) -> dict[str, Any]:
    """Everything `turnstile status` shows about one run."""
    tenant, stored = resolve(c, run_id, tenant)
    state = RunState.from_json(stored[fields.STATE])
    stream = events(c, tenant, run_id)
    finished = next((e for _, e in reversed(stream) if e["type"] == "finished"), None)
    pending: dict[str, Any] | None = None
    suspended = stored.get(fields.STATUS) == Status.SUSPENDED.value
    if state.held_budget is not None and suspended:  # a budget hold, its fields as stored
        pending = msgspec.to_builtins(state.held_budget)
    elif state.pending is not None and suspended:
        held = state.pending
        pending = {"kind": "call", "tool": held.call.name, "args": held.call.args,
                   "digest": held.digest, "reason": held.reason, **_room(c, state)}  # fmt: skip
    return {
        "run_id": run_id, "tenant": tenant, "status": stored.get(fields.STATUS, ""),
        "outcome": stored.get(fields.OUTCOME, ""), "detail": stored.get(fields.DETAIL, ""),
        "reason": stored.get(fields.REASON, ""), "queue": stored.get(fields.QUEUE, ""),
        "priority": stored_priority(stored.get(fields.PRIORITY)),
        "job": stored.get(fields.JOB, ""), "user": stored.get(fields.USER, ""),
        "job_version": state.job_version,
        "version": int(stored.get(fields.VERSION) or 0),
        "created_ms": int(stored.get(fields.CREATED_MS) or 0),
        "updated_ms": int(stored.get(fields.UPDATED_MS) or 0),
        "cancel_requested_by": stored.get(fields.CANCEL_BY, ""),
        "usage": msgspec.to_builtins(state.usage), "budget": msgspec.to_builtins(state.budget),
        "plan": [{"id": s.id, "tool": s.tool, "status": s.status} for s in state.plan],
        "pending": pending, "decisions": msgspec.to_builtins(state.decisions),
        "answer": state.answer, "message": finished.get("message") if finished else None,
        "last_result": state.last_result,
        "events": len(stream), "last_event": stream[-1][1]["type"] if stream else None,
        "waiting": waiting(stored.get(fields.STATUS, ""), stream),
        "origin": origin_of(state),  # a fork's: the run and turn it started from
    }  # fmt: skip


def _room(c: Client, state: RunState) -> dict[str, Any]:
    """What the held call charges its tenant (`charges`) and, when a hard ceiling has no room
    left for it, why an approval is refused now (`no_room`, a sentence; else None)."""
    try:
        charges = call_charges(state, c.jobs.get(state.job))
    except TurnstileError:  # a job this process does not know: what it charges is unknown
        return {}
    if not charges or state.pending is None:
        return {"charges": charges, "no_room": None}
    ledger = c.ledger.read(state.tenant)
    return {"charges": charges,
            "no_room": no_room(state.tenant, state.pending.call.name, charges, ledger)}  # fmt: skip


def waiting(status: str, stream: list[tuple[str, dict[str, Any]]]) -> dict[str, Any] | None:
    """What a running run waits for, when its last event deferred its next turn: a provider's
    rate limit (the endpoint, the limit, until when); None otherwise."""
    last = stream[-1][1] if stream else {}
    if status != Status.RUNNING.value or last.get("type") != "rate_limited" or last.get("ended"):
        return None
    return {k: last.get(k) for k in ("endpoint", "limit", "wait_ms", "until")}


def follow(
    c: Client,
    tenant: str,
    run_id: str,
    *,
    timeout_s: float | None = None,
) -> Iterator[tuple[str, dict[str, Any]]]:
    """The run's events from the first, then live as they are appended, until the run stops
    (its `finished` event) or `timeout_s` passes: `Client.events`, as (id, event) pairs."""
    for event in c.events(run_id, tenant=tenant, timeout_s=timeout_s):
        yield event.id, event.data


# -- trace ----------------------------------------------------------------------------------


def origin(c: Client, tenant: str, run_id: str) -> dict[str, Any] | None:
    """Where a forked run came from (run_id, tenant, turn, and an evaluation's id and mode),
    from its state; None for a run that is not a fork."""
    try:
        return origin_of(RunState.from_json(c.store.hash(tenant, run_id).get(fields.STATE, "")))
    except StateFormatError:
        return None


def origin_of(state: RunState) -> dict[str, Any] | None:
    if state.origin is None:
        return None
    out: dict[str, Any] = msgspec.to_builtins(state.origin)
    out.pop("calls", None)  # an evaluation's recording: data for its tools, not for a reader
    return out


def spans(c: Client, run_id: str, tenant: str | None = None) -> tuple[str, list[Span]]:
    """The run's spans, turn by turn, as its turn events recorded them."""
    tenant, _ = resolve(c, run_id, tenant)
    out: list[Span] = []
    for _, event in events(c, tenant, run_id):
        if event["type"] == "turn":
            out += msgspec.convert(event.get("spans") or [], list[Span])
    return tenant, out
