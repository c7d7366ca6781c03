"""`turnstile pause | resume | drain | queues`: the flags on queues and tenants, and what the
queues hold. Each command is its options (options.py) over `worker.ops.flags` or
`worker.ops.queues`."""

from __future__ import annotations

import dataclasses
import json

import typer
from rich.markup import escape
from rich.table import Table

from turnstile.worker.cli.common import (
    Connection,
    JsonFlag,
    console_for_tables,
    echo_json,
    fail,
    from_options,
)
from turnstile.worker.cli.options import (
    ControlQueue,
    ControlTenant,
    DrainQueue,
    DrainTimeout,
    DrainWait,
    Operator,
)
from turnstile.worker.ops import flags
from turnstile.worker.ops import queues as queue_views
from turnstile.worker.ops.flags import Flagged
from turnstile.worker.ops.queues import QueueView
from turnstile.worker.ops.subjects import Subject


def _subject(queue: str | None, tenant: str | None) -> Subject:
    if (queue is None) == (tenant is None):
        fail("give exactly one of --queue or --tenant", code=2)
    return Subject(queue=queue, tenant=tenant)


# --queue or --tenant, as the command's `subject`.
with_subject = from_options(
    "subject", (("queue", ControlQueue), ("tenant", ControlTenant)), _subject
)


def _flag_line(flagged: Flagged) -> str:
    what = f"{flagged.target} {flagged.name!r}"
    if flagged.already:
        return f"{what} was already {flagged.flag} (by {flagged.by} since {flagged.at}); no change"
    return f"{what} is {flagged.flag} (by {flagged.by} at {flagged.at})"


def _depth(depth: int | None) -> str:
    return "?" if depth is None else str(depth)


@with_subject
def pause(conn: Connection, subject: Subject, by: Operator = "", as_json: JsonFlag = False) -> None:
    """Pause a queue or a tenant: from the next turn boundary on, every worker parks its runs
    instead of running them; nothing more is reserved for them."""
    flagged = flags.pause(conn.client, subject, by=by)
    typer.echo(json.dumps(dataclasses.asdict(flagged)) if as_json else _flag_line(flagged))


@with_subject
def resume(
    conn: Connection, subject: Subject, by: Operator = "", as_json: JsonFlag = False
) -> None:
    """Resume a paused tenant, or a paused or draining queue: clear the flag and re-enqueue
    each parked run once."""
    done = flags.resume(conn.client, subject, by=by)
    if as_json:
        echo_json(dataclasses.asdict(done))
        return
    if not done.cleared:
        what = "paused" if done.target == "tenant" else "paused or draining"
        typer.echo(f"{done.target} {done.name!r} was not {what}; no change")
        return
    line = (
        f"resumed {done.target} {done.name!r} (cleared {', '.join(done.cleared)}): "
        f"{len(done.resumed)} parked run(s) re-enqueued"
    )
    if done.deferred:
        line += f" ({len(done.deferred)} to be sent by the sweeper: the broker did not answer)"
    if done.still_parked:
        line += f"; {done.still_parked} stay parked behind another pause or drain"
    typer.echo(line)


def drain(
    conn: Connection,
    queue: DrainQueue,
    wait: DrainWait = False,
    timeout_s: DrainTimeout = None,
    by: Operator = "",
    as_json: JsonFlag = False,
) -> None:
    """Drain a queue: refuse new submissions to it, let the turns in flight finish, and park
    its runs at their next boundary. `resume --queue` brings them back."""
    if timeout_s is not None and not wait:
        fail("--timeout-s applies only with --wait", code=2)
    flagged = flags.drain(conn.client, queue, by=by)
    view = queue_views.wait_drained(conn.client, queue, timeout_s=timeout_s) if wait else None
    if as_json:
        echo_json({"drain": dataclasses.asdict(flagged),
                   "queue": dataclasses.asdict(view) if view else None})  # fmt: skip
        return
    typer.echo(_flag_line(flagged))
    if view is not None:
        typer.echo(
            f"drained: {view.in_flight} in flight, {view.parked} parked, "
            f"{view.running} not yet parked, {_depth(view.depth)} waiting on the broker"
        )


def queues(conn: Connection, as_json: JsonFlag = False) -> None:
    """Every queue: messages waiting, turns in flight, runs parked, dead letters (see
    `turnstile dead-letters`), paused or draining, or broken (a key of another type where
    one of its lists is: the dispatcher skips it until it is mended)."""
    views = queue_views.queues(conn.client)
    if as_json:
        echo_json([{**dataclasses.asdict(v), "pending": v.pending} for v in views])
        return
    table = Table(
        "queue", "depth", "pending", "in flight", "running", "parked", "dead letters", "state"
    )
    for v in views:
        flagged = (("paused", v.paused, v.paused_by), ("draining", v.draining, v.draining_by))
        state = ", ".join(f"{flag} by {who} since {at}" for flag, at, who in flagged if at)
        if v.broken:  # the dispatcher skips it until its keys are mended
            state = ", ".join(s for s in (f"BROKEN: {v.broken}", state) if s)
        table.add_row(
            escape(v.name), _depth(v.depth), str(v.pending), str(v.in_flight), str(v.running),
            str(v.parked), _depth(v.dead_letters), escape(state or "open"),
        )  # fmt: skip
    console_for_tables().print(table)
    _tenant_table(views)


def _tenant_table(views: list[QueueView]) -> None:
    """Fair share, per queue and tenant: steps waiting for the dispatcher, turns in flight
    (the tenant's, every queue), its cap and weight."""
    rows = [(v.name, t) for v in views for t in v.tenants]
    if not rows:
        return
    table = Table("queue", "tenant", "waiting", "in flight", "cap", "active runs", "cap",
                  "weight")  # fmt: skip
    for name, t in rows:
        caps = ["-" if t[k] is None else str(t[k]) for k in ("cap", "runs_cap")]
        table.add_row(escape(name), escape(t["tenant"]), str(t["waiting"]), str(t["in_flight"]),
                      caps[0], str(t["active_runs"]), caps[1], str(t["weight"]))  # fmt: skip
    console_for_tables().print(table)


COMMANDS = (pause, resume, drain, queues)
