"""`turnstile runs | status | watch | trace | replay`: reading runs, each command its options
over `worker.ops.listing`, `worker.ops.views` or `worker.ops.replay`. Scoped to
`TURNSTILE_TENANT` when it is set."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from typing import Any

import msgspec
import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn
from rich.table import Column, Table

from turnstile.jobs.tools import one_line
from turnstile.jobs.trace import postmortem, span_tree
from turnstile.worker.cli.common import Connection, JsonFlag, console_for_tables, echo_json
from turnstile.worker.cli.options import (
    Cursor,
    Limit,
    OutcomeFilter,
    RunId,
    StatusFilter,
    Tenant,
    WatchTimeout,
)
from turnstile.worker.cli.render import describe, observation_line, span_status
from turnstile.worker.client._client import Client
from turnstile.worker.ops import decisions, listing, views
from turnstile.worker.ops.replay import replay_run


def _n(value: int | None) -> str:
    return "-" if value is None else str(value)


def runs(
    conn: Connection,
    tenant: Tenant = None,
    status: StatusFilter = None,
    outcome: OutcomeFilter = None,
    limit: Limit = 100,
    cursor: Cursor = None,
    as_json: JsonFlag = False,
) -> None:
    """Runs, newest first, a page at a time: one tenant's with --tenant, every tenant's
    without. A page that is not the last ends with the cursor of the next."""
    c = conn.client
    page = listing.page_runs(
        c, tenant=tenant, status=status, outcome=outcome, limit=limit, cursor=cursor
    )
    c.store.fence("the runs read are")  # shown only once as durable as the setting wants
    rows = page.rows
    if as_json:
        echo_json({"runs": [dataclasses.asdict(r) for r in rows], "next_cursor": page.next_cursor})
        return
    whole = [Column(name, no_wrap=True) for name in ("run", "tenant")]  # copied, never cut
    table = Table(*whole, "status", "outcome", "detail", "queue", "pri", "steps", "tokens")
    for r in rows:
        detail = f"{r.detail}: {r.reason}" if r.detail and r.reason else r.detail or r.reason
        table.add_row(
            r.run_id, escape(r.tenant), r.status, r.outcome, escape(one_line(detail, 80)),
            escape(r.queue), str(r.priority), _n(r.steps), _n(r.tokens),
        )  # fmt: skip
    console_for_tables().print(table)
    if page.next_cursor:
        typer.echo(f"more: --cursor {page.next_cursor}")


def status(
    conn: Connection, run_id: RunId, tenant: Tenant = None, as_json: JsonFlag = False
) -> None:
    """One run: where it is, what it used, what it holds for a decision, how it ended."""
    c = conn.client
    view = views.run_view(c, run_id, tenant)
    c.store.fence(f"the state of run {run_id} read is")
    if as_json:
        echo_json(view)
        return
    table = Table("field", "value", show_header=False)
    if view.get("outcome"):  # the code, its detail, and the reason in words, on one line
        code = f"{view['outcome']} ({view['detail']})" if view.get("detail") else view["outcome"]
        view = {**view, "outcome": f"{code}: {view['reason']}" if view.get("reason") else code}
    for key in ("run_id", "tenant", "status", "outcome", "queue", "priority", "job",
                "job_version", "user", "version", "cancel_requested_by", "answer",
                "message"):  # fmt: skip
        if view.get(key) not in (None, ""):
            table.add_row(key, escape(str(view[key])))
    if view.get("status") == "parked" and view.get("reason"):  # a pause, a drain, a version
        table.add_row("parked", escape(str(view["reason"])))
    if view.get("waiting"):
        w = view["waiting"]
        table.add_row("waiting", escape(f"for the rate limit of {w['endpoint']} ({w['limit']}) "
                                        f"until {w['until']}"))  # fmt: skip
    if view.get("origin"):
        o = view["origin"]
        said = f"{o['run_id']} at turn {o['turn']}"
        table.add_row("forked from", escape(said + (f" (evaluation {o['evaluation']})"
                                                    if o.get("evaluation") else "")))  # fmt: skip
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
        _held_rows(table, view["pending"])
    for d in view["decisions"]:
        table.add_row("decision", escape(f"{d['kind']} by {d['by']} at {d['at']}"))
    console_for_tables().print(table)


def _held_rows(table: Table, held: dict[str, Any]) -> None:
    """What the run holds for a person: a budget, per amount (spent, needed, suggested), or a
    call, with what it charges and, when its tenant cannot afford it, why approving is refused."""
    if held.get("kind") == "budget":
        table.add_row("held budget", escape(", ".join(held["dimensions"])))
        for name in held["suggested"]:
            table.add_row(
                f"  {name}",
                f"spent {held['spent'][name]} of {held['limits'][name]}; the next turn needs "
                f"{held['needed'][name]}; suggested {name}={held['suggested'][name]}",
            )
    else:
        table.add_row("held call", escape(f"{held['tool']} {json.dumps(held['args'])}"))
        if held.get("charges"):
            table.add_row("charges", escape(_limits(held["charges"])))
        if held.get("no_room"):
            table.add_row("cannot approve", escape(held["no_room"]))
    table.add_row("digest", held["digest"])


def _limits(amounts: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in amounts.items())


def watch(
    conn: Connection,
    run_id: RunId,
    tenant: Tenant = None,
    timeout_s: WatchTimeout = None,
    as_json: JsonFlag = False,
) -> None:
    """Follow a run's events live until it stops. Each event is shown after it was read back
    from the store, so what is watched is what is stored. --json: one event per line."""
    c = conn.client
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
    c: Client, stream: Iterator[tuple[str, dict[str, Any]]]
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
    conn: Connection, run_id: RunId, tenant: Tenant = None, as_json: JsonFlag = False
) -> None:
    """A run's span tree, turn by turn, and its post-mortem."""
    tenant, spans = views.spans(conn.client, run_id, tenant)
    summary = postmortem(spans)
    origin = views.origin(conn.client, tenant, run_id)
    if as_json:
        echo_json({"run_id": run_id, "origin": origin, "spans": msgspec.to_builtins(spans),
                   "postmortem": summary})  # fmt: skip
        return
    console = Console()
    if origin is not None:  # a fork: the run and the turn it started from
        said = f"forked from {origin['run_id']} at turn {origin['turn']}"
        if origin.get("evaluation"):
            said += f" (evaluation {origin['evaluation']}, {origin.get('mode')})"
        console.print(escape(said), highlight=False, soft_wrap=True)
    for depth, span in span_tree(spans):
        extra = {k: span.attrs[k] for k in ("args", "input_tokens", "output_tokens", "model",
                                            "fallback") if k in span.attrs}  # fmt: skip
        shown = span_status(msgspec.to_builtins(span))
        line = f"{'  ' * depth}{span.id} {span.kind} {span.name} {shown} "
        line += f"{span.duration_s:.3f}s {json.dumps(extra) if extra else ''}"
        console.print(escape(line.rstrip()), highlight=False, soft_wrap=True)
    console.print(escape(f"post-mortem: {json.dumps(summary)}"), highlight=False, soft_wrap=True)


def replay(
    conn: Connection, run_id: RunId, tenant: Tenant = None, as_json: JsonFlag = False
) -> None:
    """Run the kernel again from the run's recorded model replies and say whether it reaches
    the stored state; exits 1 when it does not."""
    result = replay_run(conn.client, run_id, tenant)
    if as_json:
        echo_json(dataclasses.asdict(result))
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


COMMANDS = (runs, status, watch, trace, replay)
