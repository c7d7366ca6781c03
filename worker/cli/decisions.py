"""`turnstile approve | deny | cancel`: an operator's decisions on a run, each its options over
`worker.ops.decisions`. Scoped to `TURNSTILE_TENANT` when it is set."""

from __future__ import annotations

import typer

from turnstile.jobs.extensions import parse_limits
from turnstile.worker.cli.common import Connection, JsonFlag, echo_json
from turnstile.worker.cli.options import (
    CancelReason,
    DenyReason,
    Digest,
    Extend,
    Operator,
    RunId,
    Tenant,
)
from turnstile.worker.ops import decisions


def _next_step(sent: bool) -> str:
    if sent:
        return "it runs next"
    return "accepted; the step will be sent when the broker is back"


def approve(
    conn: Connection,
    run_id: RunId,
    digest: Digest = None,
    extend: Extend = None,
    tenant: Tenant = None,
    by: Operator = "",
    as_json: JsonFlag = False,
) -> None:
    """Approve the call a suspended run holds: exactly that tool with those arguments. For a run
    held needs_budget, approve an extension: --extend tokens=50000 (or the suggested limits)."""
    c = conn.client
    limits = None if extend is None else parse_limits(extend)
    state = decisions.approve(c, run_id, by=by, digest=digest, tenant=tenant, extend=limits)
    sent = run_id not in c.deferred
    decision = state.decisions[-1]
    if decision.kind == "extended":
        assert decision.limits is not None
        if as_json:
            echo_json({"run_id": run_id, "decision": "extended", "digest": decision.digest,
                       "limits": decision.limits, "by": decision.by, "at": decision.at,
                       "status": state.status.value, "sent": sent})  # fmt: skip
            return
        shown = " ".join(f"{k}={v}" for k, v in decision.limits.items())
        typer.echo(f"extended run {run_id} to {shown}; {_next_step(sent)}")
        return
    if as_json:
        echo_json({"run_id": run_id, "decision": "approved", "digest": decision.digest,
                   "by": decision.by, "at": decision.at, "status": state.status.value,
                   "sent": sent})  # fmt: skip
        return
    typer.echo(f"approved the held call {decision.digest} of run {run_id}; {_next_step(sent)}")


def deny(
    conn: Connection,
    run_id: RunId,
    reason: DenyReason,
    tenant: Tenant = None,
    by: Operator = "",
    as_json: JsonFlag = False,
) -> None:
    """Deny the call a suspended run holds: the run ends approval_denied, or, for a job that
    allows it, the model is shown the denial. A run held needs_budget ends budget_exhausted."""
    c = conn.client
    state = decisions.deny(c, run_id, by=by, reason=reason, tenant=tenant)
    sent = run_id not in c.deferred
    outcome = state.outcome.value if state.outcome else None
    if as_json:
        echo_json({"run_id": run_id, "decision": "denied", "status": state.status.value,
                   "outcome": outcome, "sent": sent})  # fmt: skip
        return
    ended = (
        f"it ended {outcome}" if outcome else f"the model is shown the denial; {_next_step(sent)}"
    )
    what = "budget extension" if outcome == "budget_exhausted" else "held call"
    typer.echo(f"denied the {what} of run {run_id}; {ended}")


def cancel(
    conn: Connection,
    run_id: RunId,
    reason: CancelReason = "cancelled by an operator",
    tenant: Tenant = None,
    by: Operator = "",
    as_json: JsonFlag = False,
) -> None:
    """Cancel a run: at once unless one of its turns is in flight, then at its next turn
    boundary."""
    done = decisions.cancel(conn.client, run_id, by=by, reason=reason, tenant=tenant)
    if as_json:
        echo_json({"run_id": run_id, "cancel": done})
    elif done == "cancelled":
        typer.echo(f"cancelled run {run_id}")
    else:
        typer.echo(f"cancel requested: run {run_id} ends cancelled at its next turn boundary")


COMMANDS = (approve, deny, cancel)
