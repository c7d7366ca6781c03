"""Operator commands of `turnstile`: pause, resume, drain, approve, deny, cancel, runs, status,
watch, trace, replay, queues. Each is a few lines over `worker.control`, `worker.replay` and
the client; `register` mounts them on the main command.

Every option has an environment variable. The control commands read their target from
`TURNSTILE_CONTROL_QUEUE` / `TURNSTILE_CONTROL_TENANT`, not from the `TURNSTILE_QUEUE` /
`TURNSTILE_TENANT` that submissions use, so a shell set up to submit cannot pause by accident;
the read and decision commands are scoped to `TURNSTILE_TENANT` when it is set.
"""

from __future__ import annotations

import dataclasses
import getpass
import json
import socket
from collections.abc import Callable, Iterator
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn
from rich.table import Column, Table

from turnstile.worker.cli.common import BrokerUrl, JsonFlag, Operator, RedisUrl, client, fail

ControlQueue = Annotated[
    str | None,
    typer.Option("--queue", envvar="TURNSTILE_CONTROL_QUEUE", show_default=False,
                 help="The queue to act on (every tenant's runs on it)."),
]  # fmt: skip
ControlTenant = Annotated[
    str | None,
    typer.Option("--tenant", envvar="TURNSTILE_CONTROL_TENANT", show_default=False,
                 help="The tenant to act on (its runs on every queue)."),
]  # fmt: skip
DrainQueue = Annotated[
    str,
    typer.Option("--queue", envvar="TURNSTILE_CONTROL_QUEUE", show_default=False,
                 help="The queue to drain."),
]  # fmt: skip
DrainWait = Annotated[
    bool,
    typer.Option("--wait", envvar="TURNSTILE_DRAIN_WAIT",
                 help="Return only when no turn of the queue is in flight."),
]  # fmt: skip
DrainTimeout = Annotated[
    float | None,
    typer.Option("--timeout-s", envvar="TURNSTILE_DRAIN_TIMEOUT_S", min=0, show_default=False,
                 help="With --wait: give up after this many seconds."),
]  # fmt: skip
Tenant = Annotated[
    str | None,
    typer.Option("--tenant", envvar="TURNSTILE_TENANT", show_default=False,
                 help="Only this tenant's runs; another tenant's run is not found."),
]  # fmt: skip
RunId = Annotated[str, typer.Argument(help="The run's id.", show_default=False)]
Digest = Annotated[
    str | None,
    typer.Option("--digest", envvar="TURNSTILE_DIGEST", show_default=False,
                 help="Approve only if the held call has this digest (see `status`)."),
]  # fmt: skip
DenyReason = Annotated[
    str,
    typer.Option("--reason", envvar="TURNSTILE_DENY_REASON", show_default=False,
                 help="Why, for the record (and the model, for a job that shows it)."),
]  # fmt: skip
CancelReason = Annotated[
    str, typer.Option("--reason", envvar="TURNSTILE_CANCEL_REASON", help="For the record.")
]
StatusFilter = Annotated[
    str | None,
    typer.Option("--status", envvar="TURNSTILE_STATUS", show_default=False,
                 help="running, suspended, parked or stopped."),
]  # fmt: skip
OutcomeFilter = Annotated[
    str | None,
    typer.Option("--outcome", envvar="TURNSTILE_OUTCOME", show_default=False,
                 help="completed, budget_exhausted, cancelled, ... (see DESIGN.md)."),
]  # fmt: skip
Limit = Annotated[
    int, typer.Option("--limit", envvar="TURNSTILE_LIMIT", min=1, max=10_000,
                      help="Runs on one page.")
]  # fmt: skip
Cursor = Annotated[
    str | None,
    typer.Option("--cursor", envvar="TURNSTILE_CURSOR", show_default=False,
                 help="Continue a listing: the next_cursor a page gave."),
]  # fmt: skip
WatchTimeout = Annotated[
    float | None,
    typer.Option("--timeout-s", envvar="TURNSTILE_WATCH_TIMEOUT_S", min=0, show_default=False,
                 help="Stop following after this many seconds."),
]  # fmt: skip


def _by(by: str) -> str:
    return by or f"{getpass.getuser()}@{socket.gethostname()}"


def _json(data: Any) -> None:
    typer.echo(json.dumps(data, default=str))


def _subject(queue: str | None, tenant: str | None) -> Any:
    from turnstile.worker.ops.subjects import Subject

    if (queue is None) == (tenant is None):
        fail("give exactly one of --queue or --tenant", code=2)
    return Subject(queue=queue, tenant=tenant)


def _flag_line(flagged: Any) -> str:
    what = f"{flagged.target} {flagged.name!r}"
    if flagged.already:
        return f"{what} was already {flagged.flag} (by {flagged.by} since {flagged.at}); no change"
    return f"{what} is {flagged.flag} (by {flagged.by} at {flagged.at})"


def _depth(depth: int | None) -> str:
    return "?" if depth is None else str(depth)


def console_for_tables() -> Console:
    """A console for tables: a piped table is as wide as it needs (up to 160 columns), not
    the 80 rich assumes without a terminal."""
    console = Console()
    return console if console.is_terminal else Console(width=max(console.width, 160))


def _n(value: int | None) -> str:
    return "-" if value is None else str(value)


REASON_CHARS = 160  # a reason beside its code, in a readable view: one line, this long at most


def with_reason(code: object, reason: object, limit: int = REASON_CHARS) -> str:
    """A code with the text that explains it, on one bounded line: `tool_raised (KeyError: x)`."""
    from turnstile.jobs.tools import one_line

    if reason in (None, "", [], {}):
        return str(code)
    text = reason if isinstance(reason, str) else json.dumps(reason)
    return f"{code} ({one_line(text, limit)})"


def observation_line(result: Any, limit: int = REASON_CHARS) -> str:
    """A turn's observation(s) as one line: each call's code and, for an error, why."""
    from turnstile.jobs.tools import one_line

    def one(o: Any) -> str:
        if not isinstance(o, dict):
            return str(o)
        code = o.get("code") or o.get("status")
        shown = with_reason(code, o.get("detail") if o.get("status") == "error" else None, 100)
        return f"{o['tool']}->{shown}" if "tool" in o else shown

    items = result if isinstance(result, list) else [result]
    return one_line(", ".join(one(o) for o in items), limit)


# -- pause, resume, drain, queues -------------------------------------------------------------


def pause(
    queue: ControlQueue = None,
    tenant: ControlTenant = None,
    by: Operator = "",
    as_json: JsonFlag = False,
    redis_url: RedisUrl = None,
    broker_url: BrokerUrl = None,
) -> None:
    """Pause a queue or a tenant: from the next turn boundary on, every worker parks its runs
    instead of running them; nothing more is reserved for them."""
    from turnstile.worker.ops import flags

    subject = _subject(queue, tenant)
    with client(redis_url, broker_url) as c:
        flagged = flags.pause(c, subject, by=_by(by))
    typer.echo(json.dumps(dataclasses.asdict(flagged)) if as_json else _flag_line(flagged))


def resume(
    queue: ControlQueue = None,
    tenant: ControlTenant = None,
    by: Operator = "",
    as_json: JsonFlag = False,
    redis_url: RedisUrl = None,
    broker_url: BrokerUrl = None,
) -> None:
    """Resume a paused tenant, or a paused or draining queue: clear the flag and re-enqueue
    each parked run once."""
    from turnstile.worker.ops import flags

    subject = _subject(queue, tenant)
    with client(redis_url, broker_url) as c:
        done = flags.resume(c, subject, by=_by(by))
    if as_json:
        _json(dataclasses.asdict(done))
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
    queue: DrainQueue,
    wait: DrainWait = False,
    timeout_s: DrainTimeout = None,
    by: Operator = "",
    as_json: JsonFlag = False,
    redis_url: RedisUrl = None,
    broker_url: BrokerUrl = None,
) -> None:
    """Drain a queue: refuse new submissions to it, let the turns in flight finish, and park
    its runs at their next boundary. `resume --queue` brings them back."""
    from turnstile.worker.ops import flags, queues

    if timeout_s is not None and not wait:
        fail("--timeout-s applies only with --wait", code=2)
    with client(redis_url, broker_url) as c:
        flagged = flags.drain(c, queue, by=_by(by))
        view = queues.wait_drained(c, queue, timeout_s=timeout_s) if wait else None
    if as_json:
        _json({"drain": dataclasses.asdict(flagged),
               "queue": dataclasses.asdict(view) if view else None})  # fmt: skip
        return
    typer.echo(_flag_line(flagged))
    if view is not None:
        typer.echo(
            f"drained: {view.in_flight} in flight, {view.parked} parked, "
            f"{view.running} not yet parked, {_depth(view.depth)} waiting on the broker"
        )


def queues(
    as_json: JsonFlag = False, redis_url: RedisUrl = None, broker_url: BrokerUrl = None
) -> None:
    """Every queue: messages waiting, turns in flight, runs parked, dead letters (see
    `turnstile dead-letters`), paused or draining."""
    from turnstile.worker.ops import queues

    with client(redis_url, broker_url) as c:
        views = queues.queues(c)
    if as_json:
        _json([{**dataclasses.asdict(v), "pending": v.pending} for v in views])
        return
    table = Table(
        "queue", "depth", "pending", "in flight", "running", "parked", "dead letters", "state"
    )
    for v in views:
        flags = (("paused", v.paused, v.paused_by), ("draining", v.draining, v.draining_by))
        state = ", ".join(f"{flag} by {who} since {at}" for flag, at, who in flags if at)
        table.add_row(
            escape(v.name), _depth(v.depth), str(v.pending), str(v.in_flight), str(v.running),
            str(v.parked), _depth(v.dead_letters), escape(state or "open"),
        )  # fmt: skip
    console_for_tables().print(table)
    _tenant_table(views)


def _tenant_table(views: list[Any]) -> None:
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


# -- decisions ------------------------------------------------------------------------------


def _next_step(sent: bool) -> str:
    if sent:
        return "it runs next"
    return "accepted; the step will be sent when the broker is back"


def approve(
    run_id: RunId,
    digest: Digest = None,
    tenant: Tenant = None,
    by: Operator = "",
    as_json: JsonFlag = False,
    redis_url: RedisUrl = None,
    broker_url: BrokerUrl = None,
) -> None:
    """Approve the call a suspended run holds: exactly that tool with those arguments."""
    from turnstile.worker.ops import decisions

    with client(redis_url, broker_url) as c:
        state = decisions.approve(c, run_id, by=_by(by), digest=digest, tenant=tenant)
        sent = run_id not in c.deferred
    decision = state.decisions[-1]
    if as_json:
        _json({"run_id": run_id, "decision": "approved", "digest": decision.digest,
               "by": decision.by, "at": decision.at, "status": state.status.value,
               "sent": sent})  # fmt: skip
        return
    typer.echo(f"approved the held call {decision.digest} of run {run_id}; {_next_step(sent)}")


def deny(
    run_id: RunId,
    reason: DenyReason,
    tenant: Tenant = None,
    by: Operator = "",
    as_json: JsonFlag = False,
    redis_url: RedisUrl = None,
    broker_url: BrokerUrl = None,
) -> None:
    """Deny the call a suspended run holds: the run ends approval_denied, or, for a job that
    allows it, the model is shown the denial."""
    from turnstile.worker.ops import decisions

    with client(redis_url, broker_url) as c:
        state = decisions.deny(c, run_id, by=_by(by), reason=reason, tenant=tenant)
        sent = run_id not in c.deferred
    outcome = state.outcome.value if state.outcome else None
    if as_json:
        _json({"run_id": run_id, "decision": "denied", "status": state.status.value,
               "outcome": outcome, "sent": sent})  # fmt: skip
        return
    ended = (
        f"it ended {outcome}" if outcome else f"the model is shown the denial; {_next_step(sent)}"
    )
    typer.echo(f"denied the held call of run {run_id}; {ended}")


def cancel(
    run_id: RunId,
    reason: CancelReason = "cancelled by an operator",
    tenant: Tenant = None,
    by: Operator = "",
    as_json: JsonFlag = False,
    redis_url: RedisUrl = None,
    broker_url: BrokerUrl = None,
) -> None:
    """Cancel a run: at once unless one of its turns is in flight, then at its next turn
    boundary."""
    from turnstile.worker.ops import decisions

    with client(redis_url, broker_url) as c:
        done = decisions.cancel(c, run_id, by=_by(by), reason=reason, tenant=tenant)
    if as_json:
        _json({"run_id": run_id, "cancel": done})
    elif done == "cancelled":
        typer.echo(f"cancelled run {run_id}")
    else:
        typer.echo(f"cancel requested: run {run_id} ends cancelled at its next turn boundary")


# -- reading --------------------------------------------------------------------------------


def runs(
    tenant: Tenant = None,
    status: StatusFilter = None,
    outcome: OutcomeFilter = None,
    limit: Limit = 100,
    cursor: Cursor = None,
    as_json: JsonFlag = False,
    redis_url: RedisUrl = None,
    broker_url: BrokerUrl = None,
) -> None:
    """Runs, newest first, a page at a time: one tenant's with --tenant, every tenant's
    without. A page that is not the last ends with the cursor of the next."""
    from turnstile.worker.ops import listing

    with client(redis_url, broker_url) as c:
        page = listing.page_runs(
            c, tenant=tenant, status=status, outcome=outcome, limit=limit, cursor=cursor
        )
        c.store.fence("the runs read are")  # shown only once as durable as the setting wants
    rows = page.rows
    if as_json:
        _json({"runs": [dataclasses.asdict(r) for r in rows], "next_cursor": page.next_cursor})
        return
    whole = [Column(name, no_wrap=True) for name in ("run", "tenant")]  # copied, never cut
    table = Table(*whole, "status", "outcome", "detail", "queue", "steps", "tokens")
    for r in rows:
        detail = f"{r.detail}: {r.reason}" if r.detail and r.reason else r.detail or r.reason
        table.add_row(
            r.run_id, escape(r.tenant), r.status, r.outcome, escape(_cut(detail, 80)),
            escape(r.queue), _n(r.steps), _n(r.tokens),
        )  # fmt: skip
    console_for_tables().print(table)
    if page.next_cursor:
        typer.echo(f"more: --cursor {page.next_cursor}")


def _cut(text: str, limit: int) -> str:
    from turnstile.jobs.tools import one_line

    return one_line(text, limit)


def status(
    run_id: RunId,
    tenant: Tenant = None,
    as_json: JsonFlag = False,
    redis_url: RedisUrl = None,
    broker_url: BrokerUrl = None,
) -> None:
    """One run: where it is, what it used, what it holds for a decision, how it ended."""
    from turnstile.worker.ops import views

    with client(redis_url, broker_url) as c:
        view = views.run_view(c, run_id, tenant)
        c.store.fence(f"the state of run {run_id} read is")
    if as_json:
        _json(view)
        return
    table = Table("field", "value", show_header=False)
    if view.get("outcome"):  # the code, its detail, and the reason in words, on one line
        code = f"{view['outcome']} ({view['detail']})" if view.get("detail") else view["outcome"]
        view = {**view, "outcome": f"{code}: {view['reason']}" if view.get("reason") else code}
    for key in ("run_id", "tenant", "status", "outcome", "queue", "job", "user", "version",
                "cancel_requested_by", "answer", "message"):  # fmt: skip
        if view.get(key) not in (None, ""):
            table.add_row(key, escape(str(view[key])))
    if view.get("last_result") is not None:
        table.add_row("last result", escape(observation_line(view["last_result"])))
    usage, budget = view["usage"], view["budget"]
    table.add_row("steps", f"{usage['steps']} of {budget['max_steps']}")
    table.add_row("tool calls", f"{usage['tool_calls']} of {budget['max_tool_calls']}")
    table.add_row("tokens", f"{usage['tokens']} of {budget['max_tokens']}")
    table.add_row("active time", f"{usage['elapsed_ms'] / 1000:.1f} s of "
                                 f"{budget['deadline_ms'] / 1000:.0f} s")  # fmt: skip
    table.add_row("plan", " ".join(f"{s['id']}:{s['tool']}={s['status']}" for s in view["plan"]))
    if view["pending"]:
        held = view["pending"]
        table.add_row("held call", escape(f"{held['tool']} {json.dumps(held['args'])}"))
        table.add_row("digest", held["digest"])
    for d in view["decisions"]:
        table.add_row("decision", escape(f"{d['kind']} by {d['by']} at {d['at']}"))
    console_for_tables().print(table)


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
            said = _span_status(model)
        calls = [said]
    totals = event.get("totals") or {}
    return (
        f"turn {event.get('step')}: {', '.join(calls)} | {totals.get('tokens', 0)} tokens, "
        f"{totals.get('elapsed_ms', 0) / 1000:.1f} s | {event.get('status')}"
    )


def _finished_line(event: dict[str, Any]) -> str:
    detail = f" ({event['detail']})" if event.get("detail") else ""
    return f"finished {event.get('outcome')}{detail}: {_cut(str(event.get('reason')), 300)}"


def _span_status(span: dict[str, Any]) -> str:
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
    args = json.dumps(event.get("args"))
    return f"held for approval: {event.get('tool')} {args} (digest {event.get('digest')})"


_LINES: dict[str, Callable[[dict[str, Any]], str]] = {
    "turn": _turn_line,
    "finished": _finished_line,
    "suspended": _held_line,
    "submitted": lambda e: f"submitted to queue {e.get('queue')}",
    "decision": lambda e: f"{e.get('kind')} by {e.get('by')} at {e.get('at')}",
    "parked": lambda e: f"parked: {e.get('why')}",
    "resumed": lambda e: f"resumed by {e.get('by')}",
}


def describe(event: dict[str, Any]) -> str:
    """One line for one event of a run, as `watch` prints it."""
    line = _LINES.get(str(event.get("type")))
    return line(event) if line else json.dumps(event)


def watch(
    run_id: RunId,
    tenant: Tenant = None,
    timeout_s: WatchTimeout = None,
    as_json: JsonFlag = False,
    redis_url: RedisUrl = None,
    broker_url: BrokerUrl = None,
) -> None:
    """Follow a run's events live until it stops. Each event is shown after it was read back
    from the store, so what is watched is what is stored. --json: one event per line."""
    from turnstile.worker.ops import decisions, views

    with client(redis_url, broker_url) as c:
        tenant, _ = decisions.resolve(c, run_id, tenant)
        stream = _fenced(c, views.follow(c, tenant, run_id, timeout_s=timeout_s))
        try:
            if as_json:
                for eid, event in stream:
                    typer.echo(json.dumps({"id": eid, **event}))
            else:
                _watch_display(stream)
        except KeyboardInterrupt:
            raise typer.Exit(130) from None


def _fenced(
    c: Any, stream: Iterator[tuple[str, dict[str, Any]]]
) -> Iterator[tuple[str, dict[str, Any]]]:
    """The stream, each run-ending or deciding event shown only once it is as durable as
    TURNSTILE_DURABILITY wants (one wait per such event; turn events are shown as read)."""
    for eid, event in stream:
        if event.get("type") in ("finished", "decision", "suspended"):
            c.store.fence(f"event {eid} of the run is")
        yield eid, event


def _watch_display(stream: Iterator[tuple[str, dict[str, Any]]]) -> None:
    console = Console()
    if not console.is_terminal:  # piped: one plain line per event, no live display
        for _, event in stream:
            console.print(escape(describe(event)), highlight=False, soft_wrap=True)
        return
    columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
               MofNCompleteColumn(), TextColumn("steps"))  # fmt: skip
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task("waiting", total=None)
        for _, event in stream:
            progress.console.print(escape(describe(event)), highlight=False)
            if event.get("type") == "submitted":
                budget = (event.get("state") or {}).get("budget") or {}
                progress.update(task, total=budget.get("max_steps"), description="running")
            elif event.get("type") == "turn":
                steps = (event.get("totals") or {}).get("steps", 0)
                progress.update(task, completed=steps, description=str(event.get("status")))
            else:
                progress.update(task, description=str(event.get("type")))


def trace(
    run_id: RunId,
    tenant: Tenant = None,
    as_json: JsonFlag = False,
    redis_url: RedisUrl = None,
    broker_url: BrokerUrl = None,
) -> None:
    """A run's span tree, turn by turn, and its post-mortem."""
    import msgspec

    from turnstile.jobs.trace import postmortem, span_tree
    from turnstile.worker.ops import views

    with client(redis_url, broker_url) as c:
        _, spans = views.spans(c, run_id, tenant)
    summary = postmortem(spans)
    if as_json:
        _json({"run_id": run_id, "spans": msgspec.to_builtins(spans), "postmortem": summary})
        return
    console = Console()
    for depth, span in span_tree(spans):
        extra = {k: span.attrs[k] for k in ("args", "input_tokens", "output_tokens", "model",
                                            "fallback") if k in span.attrs}  # fmt: skip
        status = _span_status(msgspec.to_builtins(span))
        line = f"{'  ' * depth}{span.id} {span.kind} {span.name} {status} "
        line += f"{span.duration_s:.3f}s {json.dumps(extra) if extra else ''}"
        console.print(escape(line.rstrip()), highlight=False, soft_wrap=True)
    console.print(escape(f"post-mortem: {json.dumps(summary)}"), highlight=False, soft_wrap=True)


def replay(
    run_id: RunId,
    tenant: Tenant = None,
    as_json: JsonFlag = False,
    redis_url: RedisUrl = None,
    broker_url: BrokerUrl = None,
) -> None:
    """Run the kernel again from the run's recorded model replies and say whether it reaches
    the stored state; exits 1 when it does not."""
    from turnstile.worker.ops.replay import replay_run

    with client(redis_url, broker_url) as c:
        result = replay_run(c, run_id, tenant)
    if as_json:
        _json(dataclasses.asdict(result))
    elif result.matches:
        typer.echo(
            f"run {run_id}: replayed {result.turns} turn(s); same state "
            f"({result.replayed_status}, {result.replayed_outcome or 'no outcome yet'})"
        )
    else:
        diff = result.difference
        assert diff is not None
        typer.echo(
            f"run {run_id}: replayed {result.turns} turn(s); the state differs at {diff.path}: "
            f"stored {json.dumps(diff.stored)}, replayed {json.dumps(diff.replayed)}"
        )
        for note in result.notes:
            typer.echo(f"  {note}")
    if not result.matches:
        raise typer.Exit(1)


COMMANDS = (pause, resume, drain, queues, approve, deny, cancel, runs, status, watch, trace,
            replay)  # fmt: skip


def register(app: typer.Typer) -> None:
    """Mount the operator commands on the main `turnstile` command."""
    for command in COMMANDS:
        app.command()(command)
