"""`turnstile approve | deny | cancel`: an operator's decisions on a run, each its options over
`worker.ops.decisions`. Scoped to `TURNSTILE_TENANT` when it is set."""

from __future__ import annotations

import typer

from turnstile.worker.cli.common import Connection, JsonFlag, echo_json
from turnstile.worker.cli.options import CancelReason, DenyReason, Digest, Operator, RunId, Tenant
from turnstile.worker.ops import decisions


def _next_step(sent: bool) -> str:
    if sent:
        return "it runs next"
    return "accepted; the step will be sent when the broker is back"


def approve(
    conn: Connection,
    run_id: RunId,
    digest: Digest = None,
    tenant: Tenant = None,
    by: Operator = "",
    as_json: JsonFlag = False,
) -> None:
    """Approve the call a suspended run holds: exactly that tool with those arguments."""
    c = conn.client
    state = decisions.approve(c, run_id, by=by, digest=digest, tenant=tenant)
    sent = run_id not in c.deferred
    decision = state.decisions[-1]
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
    allows it, the model is shown the denial."""
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
    typer.echo(f"denied the held call of run {run_id}; {ended}")


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
