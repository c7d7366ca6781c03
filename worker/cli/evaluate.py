"""`turnstile fork` and `turnstile eval`: a new run from a recorded turn of another, and
recorded runs evaluated on a variant, thin commands over `worker.ops.fork` and
`worker.ops.evaluate`."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from turnstile.worker.cli.common import (
    Connection,
    JsonFlag,
    console_for_tables,
    echo_json,
    with_connection,
)
from turnstile.worker.cli.options import RunId, Tenant
from turnstile.worker.cli.submit import PARAM_HELP, _params
from turnstile.worker.ops import evaluate as evaluation
from turnstile.worker.ops.fork import Variant, fork_run

At = Annotated[
    int,
    typer.Option("--at", envvar="TURNSTILE_FORK_AT", show_default=False,
                 help="The turn after which the new run starts (0: the run's start)."),
]  # fmt: skip
Params = Annotated[
    list[str] | None,
    typer.Option("--param", envvar="TURNSTILE_PARAMS", help="The variant: " + PARAM_HELP),
]  # fmt: skip
Goal = Annotated[
    str | None,
    typer.Option("--goal", envvar="TURNSTILE_GOAL", show_default=False,
                 help="Another goal for the new run (default: the original's)."),
]  # fmt: skip
Queue = Annotated[str, typer.Option("--queue", envvar="TURNSTILE_QUEUE")]
Into = Annotated[
    str | None,
    typer.Option("--into", envvar="TURNSTILE_FORK_TENANT", show_default=False,
                 help="The tenant the new run is charged to (default: the original's)."),
]  # fmt: skip


def fork(
    conn: Connection,
    run_id: RunId,
    at: At,
    param: Params = None,
    goal: Goal = None,
    tenant: Tenant = None,
    into: Into = None,
    queue: Queue = "default",
    as_json: JsonFlag = False,
) -> None:
    """Start a new run from the state RUN recorded after turn --at, with its own id, budget and
    ledger charges, on a variant (--param model=..., --goal); prints the new run's id."""
    variant = Variant(params=_params(param or []), goal=goal)
    made = fork_run(conn.client, run_id, at=at, variant=variant, tenant=tenant, into=into,
                    queue=queue)  # fmt: skip
    if as_json:
        echo_json({"run_id": made.run_id, "tenant": made.tenant, "forked_from": made.origin,
                   "at_turn": made.turn, "created": made.created})  # fmt: skip
    else:
        typer.echo(made.run_id)


eval_app = typer.Typer(
    help="Evaluate recorded runs on a variant (a model, params, a goal): `turnstile eval "
    "start --tenant T --variant model=... --eval-tenant E`, then `eval show ID`.",
    no_args_is_help=True,
)


def start(
    conn: Connection,
    tenant: Annotated[str, typer.Option("--tenant", envvar="TURNSTILE_EVAL_FROM",
                      help="The tenant whose finished runs are evaluated.")],
    eval_tenant: Annotated[str, typer.Option("--eval-tenant", envvar="TURNSTILE_EVAL_TENANT",
                           help="The tenant the evaluation's runs are charged to.")],
    job: Annotated[str | None, typer.Option("--job", envvar="TURNSTILE_JOB",
                   help="Only runs of this job.")] = None,
    outcome: Annotated[str | None, typer.Option("--outcome", envvar="TURNSTILE_OUTCOME",
                       help="Only runs that ended with this outcome.")] = None,
    since: Annotated[str | None, typer.Option("--since", envvar="TURNSTILE_SINCE",
                     help="Only runs created since: an ISO time or an age (30m, 2h, 7d).")] = None,
    variant: Annotated[list[str] | None, typer.Option("--variant", envvar="TURNSTILE_VARIANT",
                       help="The variant's params, laid over each run's: " + PARAM_HELP)] = None,
    goal: Goal = None,
    from_turn: Annotated[int, typer.Option("--from-turn", envvar="TURNSTILE_FROM_TURN",
                         help="Re-run each from the state after this turn (0: its start).")] = 0,
    mode: Annotated[str, typer.Option("--mode", envvar="TURNSTILE_EVAL_MODE",
                    help="A call not in the recording: replay-reads (reads run live, writes "
                         "are held) or stop-on-divergence.")] = "replay-reads",
    limit: Annotated[int, typer.Option("--limit", envvar="TURNSTILE_EVAL_LIMIT", min=1,
                     max=evaluation.MAX_RUNS, help="At most this many runs.")] = 100,
    queue: Queue = "default",
    as_json: JsonFlag = False,
) -> None:  # fmt: skip
    """Start an evaluation: each chosen finished run re-run on the variant as a run of
    --eval-tenant, its tool calls answered from its recording; a write is never executed.
    Prints the evaluation's id."""
    selection = evaluation.Selection(tenant=tenant, job=job, outcome=outcome,
                                     since_ms=evaluation.since_ms(since), limit=limit)  # fmt: skip
    made = evaluation.start(
        conn.client, selection, Variant(params=_params(variant or [], what="--variant"),
                                           goal=goal),
        mode=mode, eval_tenant=eval_tenant, from_turn=from_turn, queue=queue,
    )  # fmt: skip
    submitted = sum(1 for r in made.runs.values() if not r.startswith(evaluation.SKIPPED))
    if as_json:
        echo_json({"eval_id": made.eval_id, "tenant": made.tenant, "runs": submitted,
                   "skipped": len(made.runs) - submitted})  # fmt: skip
    else:
        typer.echo(made.eval_id)


EvalId = Annotated[str, typer.Argument(help="The evaluation's id.", show_default=False)]


def show(conn: Connection, eval_id: EvalId, as_json: JsonFlag = False) -> None:
    """An evaluation's report: each run beside its original, and the totals."""
    said = evaluation.report(conn.client, eval_id)
    if as_json:
        echo_json(said)
        return
    table = Table("origin", "outcome", "variant run", "outcome ", "turns", "calls", "tokens",
                  "cost µ$", "diverged at")  # fmt: skip
    for row in said["runs"]:
        o, v = row["original"], row.get("variant") or {}
        table.add_row(
            row["origin"], str(o.get("outcome")), v.get("run_id") or escape(row.get("skipped", "")),
            str(v.get("outcome") or v.get("status") or "-"),
            _pair(o, v, "turns"), _pair(o, v, "tool_calls"), _pair(o, v, "tokens"),
            _pair(o, v, "cost_microusd"), str(row.get("first_divergent_turn") or "-"),
        )  # fmt: skip
    console = console_for_tables()
    console.print(table)
    t = said["totals"]
    console.print(escape(
        f"evaluation {said['eval_id']} ({said['status']}): {t['evaluated']} of {t['runs']} runs, "
        f"{t['outcomes_changed']} outcomes changed, {t['diverged']} diverged, "
        f"{t['held_writes']} writes held; cost per completed run "
        f"{t['original']['cost_per_completed_run_microusd']} -> "
        f"{t['variant']['cost_per_completed_run_microusd']} µ$; turns per run "
        f"{t['original']['turns_per_run']} -> {t['variant']['turns_per_run']}; outcomes "
        f"{json.dumps(t['original']['outcomes'])} -> {json.dumps(t['variant']['outcomes'])}"
    ), highlight=False, soft_wrap=True)  # fmt: skip


def _pair(o: dict[str, Any], v: dict[str, Any], key: str) -> str:
    return f"{o.get(key, '-')} -> {v.get(key, '-')}"


def resume(conn: Connection, eval_id: EvalId) -> None:
    """Submit what an interrupted evaluation had not submitted; each run is evaluated once."""
    made = evaluation.resume(conn.client, eval_id)
    typer.echo(f"{made.eval_id}: {len(made.runs)} runs submitted")


eval_app.command("start")(with_connection(start))
eval_app.command("show")(with_connection(show))
eval_app.command("resume")(with_connection(resume))
