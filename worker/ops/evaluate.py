"""Evaluate recorded runs on a variant: each chosen finished run (by tenant, job, outcome and
time) is forked from its start, or a turn, onto the variant as a run of the evaluation's own
tenant, whose tools answer from the origin's recording (jobs/recording.py): a write is never
executed. The evaluation is stored (worker/store/evals.py), so `resume` after a crash submits
only what is missing, each run under an id of the evaluation and its origin: each run is
evaluated once. `report` sets each run beside its original and sums them up.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import msgspec

from turnstile.jobs.outcomes import Outcome, Status
from turnstile.jobs.recording import HELD, Mode
from turnstile.jobs.state import Origin, RunState
from turnstile.worker.client._client import Client
from turnstile.worker.names import check_name, check_run_id
from turnstile.worker.ops import listing
from turnstile.worker.ops.errors import ControlError, EvaluationNotFoundError, ForkRefusedError
from turnstile.worker.ops.fork import (
    Variant,
    evaluation_run_id,
    fork_run,
    recording_of,
    state_after,
    variant_state,
)
from turnstile.worker.store import evals, fields
from turnstile.worker.store.values import now_iso

MAX_RUNS = 1000  # runs one evaluation takes at most: its spec keeps their ids
SKIPPED = "!"  # an origin the evaluation could not fork: "!<why>" in place of a run id
_AGO = re.compile(r"^(\d+)([smhd])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


@dataclass(frozen=True)
class Selection:
    """Which finished runs an evaluation takes."""

    tenant: str
    job: str | None = None
    outcome: str | None = None
    since_ms: int = 0
    limit: int = MAX_RUNS


def since_ms(text: str | None, now_s: float | None = None) -> int:
    """`--since` as epoch ms: an ISO time (2026-12-04T09:00:00Z) or an age (30m, 2h, 7d)."""
    if not text:
        return 0
    found = _AGO.match(text.strip())
    now = time.time() if now_s is None else now_s
    if found:
        return int((now - int(found.group(1)) * _UNIT_S[found.group(2)]) * 1000)
    try:
        return int(datetime.fromisoformat(text.strip().replace("Z", "+00:00")).timestamp() * 1000)
    except ValueError:
        raise ControlError(
            f"--since {text!r}: an ISO time (2026-12-04T09:00:00Z) or an age (30m, 2h, 7d)"
        ) from None


def select(c: Client, selection: Selection) -> list[str]:
    """The finished runs that match, oldest first."""
    chosen: list[str] = []
    cursor: str | None = None
    while len(chosen) < selection.limit:
        page = listing.page_runs(
            c, tenant=selection.tenant, status=Status.STOPPED.value, outcome=selection.outcome,
            limit=100, cursor=cursor,
        )  # fmt: skip
        for row in page.rows:
            if row.created_ms < selection.since_ms:
                return list(reversed(chosen))
            if selection.job is None or row.job == selection.job:
                chosen.append(row.run_id)
        if not page.next_cursor:
            break
        cursor = page.next_cursor
    return list(reversed(chosen[: selection.limit]))


def start(
    c: Client,
    selection: Selection,
    variant: Variant,
    *,
    mode: Mode | str,
    eval_tenant: str,
    from_turn: int = 0,
    queue: str = "default",
    eval_id: str | None = None,
) -> evals.Stored:
    """Choose the runs, check the variant on the first of them, store the evaluation, then
    submit its runs (`resume`). Every refusal comes before anything is stored."""
    try:
        mode = Mode(mode)
    except ValueError:
        raise ControlError(
            f"unknown mode {mode!r}; one of {', '.join(m.value for m in Mode)}"
        ) from None
    check_name("tenant", eval_tenant)
    listing.check_filter(None, selection.outcome)
    if eval_tenant == selection.tenant:
        raise ControlError("an evaluation runs under a tenant of its own: --eval-tenant")
    origins = select(c, selection)
    if not origins:
        raise ControlError(f"no finished run of tenant {selection.tenant!r} matches")
    first = recording_of(c, origins[0], selection.tenant)
    state = state_after(c, first, from_turn)  # a turn outside the run is refused here
    variant_state(
        c,
        state,
        variant,
        run_id="run_check",
        tenant=eval_tenant,
        origin=Origin(run_id=first.run_id, tenant=first.tenant, turn=from_turn),
    )
    eval_id = eval_id or f"ev_{uuid.uuid4().hex[:16]}"
    check_run_id(eval_id)
    spec = {
        "tenant": selection.tenant, "job": selection.job, "outcome": selection.outcome,
        "since_ms": selection.since_ms, "params": dict(variant.params or {}),
        "goal": variant.goal, "mode": mode.value, "from_turn": from_turn, "queue": queue,
        "origins": origins,
    }  # fmt: skip
    if not evals.create(c.client, eval_tenant, eval_id, spec, now_iso()):
        raise ControlError(f"evaluation {eval_id!r} exists")
    return resume(c, eval_id)


def load(c: Client, eval_id: str) -> evals.Stored:
    tenant = evals.tenant_of(c.client, eval_id)
    stored = evals.load(c.client, tenant, eval_id) if tenant is not None else None
    if stored is None:
        raise EvaluationNotFoundError(f"no evaluation {eval_id!r}")
    return stored


def resume(c: Client, eval_id: str) -> evals.Stored:
    """Submit every run of the evaluation not yet submitted, each under the id its evaluation
    and origin give (a run submitted before a crash is found, not made again)."""
    stored = load(c, eval_id)
    spec, tenant = stored.spec, stored.tenant
    variant = Variant(params=spec.get("params") or {}, goal=spec.get("goal"))
    for origin in spec["origins"]:
        if origin in stored.runs:
            continue
        run_id = evaluation_run_id(tenant, eval_id, origin)
        try:
            made = fork_run(
                c, origin, at=int(spec["from_turn"]), variant=variant, tenant=spec["tenant"],
                into=tenant, queue=spec.get("queue") or "default", new_run_id=run_id,
                evaluation=eval_id, mode=Mode(spec["mode"]),
            )  # fmt: skip
            evals.add_run(c.client, tenant, eval_id, origin, made.run_id)
        except ForkRefusedError as exc:  # this run only; another refusal stops the evaluation
            evals.add_run(c.client, tenant, eval_id, origin, SKIPPED + str(exc))
    evals.set_status(c.client, tenant, eval_id, "submitted")
    return load(c, eval_id)


# -- the report ---------------------------------------------------------------------------


def _reply_signature(reply: Any) -> str:
    if isinstance(reply, Mapping):
        reply = {k: v for k, v in reply.items() if k not in ("text", "reason")}
    return msgspec.json.encode(reply, order="sorted").decode()


def _turn_signatures(events: list[dict[str, Any]]) -> dict[int, str]:
    """Each turn's model reply (what it asked for), by turn number."""
    out: dict[int, str] = {}
    for event in events:
        if event.get("type") != "turn":
            continue
        model = next((s for s in event.get("spans") or [] if s.get("kind") == "model"), None)
        reply = ((model or {}).get("attrs") or {}).get("reply")
        out[int(event.get("step") or 0)] = _reply_signature(reply)
    return out


def _held_writes(events: list[dict[str, Any]]) -> int:
    count = 0
    for event in events:
        if event.get("type") != "turn":
            continue
        result = event.get("last_result")
        for item in result if isinstance(result, list) else [result]:
            inner = item.get("result") if isinstance(item, Mapping) else None
            count += isinstance(inner, Mapping) and inner.get(HELD) is True
    return count


def _side(c: Client, tenant: str, run_id: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    stored = c.store.hash(tenant, run_id)
    events = [event for _, event in c.store.events(tenant, run_id)]
    if not stored:
        return {"run_id": run_id, "status": "missing"}, events
    state = RunState.from_json(stored[fields.STATE])
    usage = state.usage
    return {
        "run_id": run_id, "status": stored.get(fields.STATUS, ""),
        "outcome": stored.get(fields.OUTCOME) or None, "turns": usage.steps,
        "tool_calls": usage.tool_calls, "tokens": usage.tokens,
        "cost_microusd": usage.cost_microusd,
    }, events  # fmt: skip


def first_divergence(original: dict[int, str], variant: dict[int, str], after: int) -> int | None:
    """The first turn after `after` whose model reply differs (or that only one run had)."""
    for step in sorted(set(original) | set(variant)):
        if step > after and original.get(step) != variant.get(step):
            return step
    return None


def report(c: Client, eval_id: str) -> dict[str, Any]:
    """Each run beside its original, and the totals."""
    stored = load(c, eval_id)
    spec = stored.spec
    rows: list[dict[str, Any]] = []
    for origin in spec["origins"]:
        original, original_events = _side(c, spec["tenant"], origin)
        made = stored.runs.get(origin)
        row: dict[str, Any] = {"origin": origin, "original": original}
        if made is None or made.startswith(SKIPPED):
            row.update(variant=None, skipped=made[1:] if made else "not submitted yet")
            rows.append(row)
            continue
        variant, variant_events = _side(c, stored.tenant, made)
        variant["held_writes"] = _held_writes(variant_events)
        row.update(variant=variant, first_divergent_turn=first_divergence(
            _turn_signatures(original_events), _turn_signatures(variant_events),
            int(spec["from_turn"]),
        ))  # fmt: skip
        rows.append(row)
    return {
        "eval_id": eval_id, "tenant": stored.tenant, "created_at": stored.created_at,
        "spec": {k: v for k, v in spec.items() if k != "origins"},
        "status": _status(stored, rows), "runs": rows, "totals": totals(rows),
    }  # fmt: skip


def _status(stored: evals.Stored, rows: list[dict[str, Any]]) -> str:
    if stored.status != "submitted":
        return stored.status  # submitting: a resume submits the rest
    ended = (Status.STOPPED.value, Status.SUSPENDED.value)
    running = [r for r in rows if r.get("variant") and r["variant"]["status"] not in ended]
    return "running" if running else "done"


def _per_run(rows: list[dict[str, Any]], side: str) -> dict[str, Any]:
    runs = [r[side] for r in rows if r.get("variant") and r[side].get("status") != "missing"]
    completed = [r for r in runs if r.get("outcome") == Outcome.COMPLETED.value]
    cost = sum(int(r.get("cost_microusd") or 0) for r in runs)
    outcomes: dict[str, int] = {}
    for r in runs:
        key = r.get("outcome") or r.get("status") or "?"
        outcomes[key] = outcomes.get(key, 0) + 1
    return {
        "runs": len(runs), "completed": len(completed), "outcomes": dict(sorted(outcomes.items())),
        "cost_microusd": cost,
        "cost_per_completed_run_microusd": cost // len(completed) if completed else None,
        "turns_per_run": round(sum(r.get("turns") or 0 for r in runs) / len(runs), 2)
        if runs else None,
        "tokens": sum(int(r.get("tokens") or 0) for r in runs),
    }  # fmt: skip


def totals(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Outcomes changed, cost per completed run and turns per run, original beside variant."""
    paired = [r for r in rows if r.get("variant")]
    changed = [r for r in paired if r["original"].get("outcome") != r["variant"].get("outcome")]
    return {
        "runs": len(rows), "evaluated": len(paired),
        "skipped": len(rows) - len(paired), "outcomes_changed": len(changed),
        "diverged": sum(r.get("first_divergent_turn") is not None for r in paired),
        "held_writes": sum(int(r["variant"].get("held_writes") or 0) for r in paired),
        "original": _per_run(rows, "original"), "variant": _per_run(rows, "variant"),
    }  # fmt: skip
