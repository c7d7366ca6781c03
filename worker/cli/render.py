"""A run's events, spans and results as the readable lines `watch`, `trace` and `status`
print: each code with, beside it, why in words, on one bounded line."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from turnstile.jobs.tools import one_line

REASON_CHARS = 160  # a reason beside its code, in a readable view: one line, this long at most


def with_reason(code: object, reason: object, limit: int = REASON_CHARS) -> str:
    """A code with the text that explains it, on one bounded line: `tool_raised (KeyError: x)`."""
    if reason in (None, "", [], {}):
        return str(code)
    text = reason if isinstance(reason, str) else json.dumps(reason)
    return f"{code} ({one_line(text, limit)})"


def observation_line(result: Any, limit: int = REASON_CHARS) -> str:
    """A turn's observation(s) as one line: each call's code and, for an error, why."""

    def one(o: Any) -> str:
        if not isinstance(o, dict):
            return str(o)
        code = o.get("code") or o.get("status")
        shown = with_reason(code, o.get("detail") if o.get("status") == "error" else None, 100)
        return f"{o['tool']}->{shown}" if "tool" in o else shown

    items = result if isinstance(result, list) else [result]
    return one_line(", ".join(one(o) for o in items), limit)


def _turn_line(event: dict[str, Any]) -> str:
    spans = event.get("spans") or []
    calls = [
        f"{s['name']}->{with_reason(s['status'], (s.get('attrs') or {}).get('detail'), 100)}"
        for s in spans
        if s.get("kind") == "tool"
    ]
    if not calls:  # a plan, a final answer or a refused reply: say which, and why refused
        model: dict[str, Any] = next((s for s in spans if s.get("kind") == "model"), {})
        reply = (model.get("attrs") or {}).get("reply")
        said = str(reply.get("type") if isinstance(reply, dict) else model.get("status"))
        result = event.get("last_result")
        if isinstance(result, dict) and result.get("status") == "error":
            said += f" -> {observation_line(result, 120)}"
        elif model.get("status") not in (None, "ok"):
            said = span_status(model)
        calls = [said]
    totals = event.get("totals") or {}
    return (
        f"turn {event.get('step')}: {', '.join(calls)} | {totals.get('tokens', 0)} tokens, "
        f"{totals.get('elapsed_ms', 0) / 1000:.1f} s | {event.get('status')}"
    )


def _finished_line(event: dict[str, Any]) -> str:
    detail = f" ({event['detail']})" if event.get("detail") else ""
    return f"finished {event.get('outcome')}{detail}: {one_line(str(event.get('reason')), 300)}"


def span_status(span: dict[str, Any]) -> str:
    """A span's status and, when it did not end ok, why in words: a tool's error detail, a
    model's error or stop reason, the problem of a reply the adapter could not read."""
    attrs = span.get("attrs") or {}
    reply = attrs.get("reply")
    if isinstance(reply, dict) and reply.get("type") == "malformed":
        return with_reason("malformed", reply.get("problem"))
    if span.get("status") in ("ok", "open"):
        return str(span.get("status"))
    why = attrs.get("detail") or attrs.get("error") or attrs.get("reason")
    return with_reason(span.get("status"), why)


def _held_line(event: dict[str, Any]) -> str:
    """A hold, in words: a budget's amounts (spent, needed, suggested) or a call and why."""
    digest = event.get("digest")
    if event.get("kind") == "budget":
        suggested = event.get("suggested") or {}
        spent, needed = event.get("spent") or {}, event.get("needed") or {}
        limits = event.get("limits") or {}
        amounts = "; ".join(
            f"{n}: {spent.get(n)} spent of a limit of {limits.get(n)}, the next turn needs "
            f"{needed.get(n)} more, suggested new limit {v}"
            for n, v in suggested.items()
        )
        extend = " ".join(f"--extend {n}={v}" for n, v in suggested.items())
        return one_line(
            f"held for a budget extension: {str(event.get('reason') or '').rstrip('.')}. "
            f"{amounts}. To go on: turnstile approve RUN --digest {digest} [{extend}]",
            600,
        )
    args = one_line(json.dumps(event.get("args")), 200)
    why = f" ({event['reason']})" if event.get("reason") else ""
    return f"held for approval: {event.get('tool')} {args}{why}, digest {digest}"


def _limits(limits: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in limits.items())


def _rate_limited_line(event: dict[str, Any]) -> str:
    """A turn deferred by a provider's rate limit, or a run it ended, in words."""
    wait_s = (event.get("wait_ms") or 0) / 1000
    limit = f"the rate limit of {event.get('endpoint')} ({event.get('limit')})"
    if event.get("ended"):
        return f"{limit} would make it wait {wait_s:.1f} s, past its deadline: it ends"
    return (
        f"waits {wait_s:.1f} s for {limit}, until {event.get('until')}, holding no worker; "
        f"turn {event.get('step')} goes then"
    )


def _followup_line(event: dict[str, Any]) -> str:
    followup = event.get("followup") or {}
    text = one_line(str(followup.get("text", "")), 200)
    return f"follow-up merged into the run (the model sees it from its next turn): {text!r}"


def _fallback_line(event: dict[str, Any]) -> str:
    """An event this module has no words for: its type and its fields, on one line."""
    fields = ", ".join(
        f"{k} {v if isinstance(v, str) else json.dumps(v)}"
        for k, v in event.items()
        if k not in ("type", "at")
    )
    return one_line(f"{event.get('type')}: {fields}" if fields else str(event.get("type")), 300)


_LINES: dict[str, Callable[[dict[str, Any]], str]] = {
    "turn": _turn_line,
    "finished": _finished_line,
    "suspended": _held_line,
    "submitted": lambda e: f"submitted to queue {e.get('queue')}",
    "decision": lambda e: (
        f"{e.get('kind')} by {e.get('by')} at {e.get('at')}"
        + (f" to {_limits(e['limits'])}" if e.get("limits") else "")
    ),
    "parked": lambda e: f"parked: {e.get('why')}",
    "resumed": lambda e: f"resumed by {e.get('by')}",
    "rate_limited": _rate_limited_line,
    "followup": _followup_line,
    "followups_unseen": lambda e: (
        f"{len(e.get('followups') or [])} follow-up(s) came after its last turn: "
        "the model never saw them"
    ),
    "interrupt_requested": lambda e: (
        f"run {e.get('by_run')} of its conversation interrupts it: it stops at its next turn"
    ),
    "superseded": lambda e: f"superseded by run {e.get('by_run')} of its conversation",
    "started": lambda e: f"started: run {e.get('after')} of its conversation ended before it",
    "cancel_requested": lambda e: (
        f"cancel requested by {e.get('by')} ({e.get('reason')}): it ends at its next turn"
    ),
}


def describe(event: dict[str, Any]) -> str:
    """One line for one event of a run, as `watch` prints it."""
    line = _LINES.get(str(event.get("type")), _fallback_line)
    return line(event)
