"""Forks and evaluations: `POST /v1/runs/{id}/fork` (a new run of the key's tenant from a
recorded turn of one of its runs), `POST /v1/evals` (operators: recorded runs evaluated on a
variant as runs of another tenant) and `GET /v1/evals/{id}` (the report)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path
from pydantic import Field, StrictInt

from turnstile.worker.http.bodies import JsonRoute
from turnstile.worker.http.context import (
    NAME,
    QUEUE,
    Caller,
    Ctx,
    Operator,
    RunIdPath,
    run_tenant,
)
from turnstile.worker.http.problems import Problem
from turnstile.worker.http.routes_runs import PROBLEMS
from turnstile.worker.http.schemas import Strict
from turnstile.worker.ops import evaluate as evaluation
from turnstile.worker.ops.fork import Variant, fork_run

router = APIRouter(responses=PROBLEMS, route_class=JsonRoute)
EvalIdPath = Annotated[str, Path(pattern=NAME, description="The evaluation's id.")]


class ForkBody(Strict):
    at: StrictInt = Field(ge=0, description="The turn after which the new run starts (0: start).")
    params: dict[str, Any] = Field(
        default_factory=dict, description="The variant: params laid over the run's own."
    )
    goal: str | None = Field(default=None, min_length=1, max_length=4000)
    queue: str = Field(default="default", pattern=QUEUE)


class EvalBody(Strict):
    tenant: str = Field(pattern=NAME, description="The tenant whose finished runs are taken.")
    eval_tenant: str = Field(pattern=NAME, description="The tenant the runs are charged to.")
    job: str | None = None
    outcome: str | None = None
    since: str | None = Field(default=None, description="An ISO time or an age (30m, 2h, 7d).")
    params: dict[str, Any] = Field(default_factory=dict, description="The variant's params.")
    goal: str | None = Field(default=None, min_length=1, max_length=4000)
    mode: str = Field(default="replay-reads", description="replay-reads | stop-on-divergence")
    from_turn: StrictInt = Field(default=0, ge=0)
    limit: StrictInt = Field(default=100, ge=1, le=evaluation.MAX_RUNS)
    queue: str = Field(default="default", pattern=QUEUE)


@router.post("/v1/runs/{run_id}/fork", status_code=202, tags=["runs"])
def fork(run_id: RunIdPath, body: ForkBody, key: Caller, ctx: Ctx) -> dict[str, Any]:
    """A new run of the key's tenant from the state its run recorded after turn `at`."""
    ctx.limiter.take(key.id)
    tenant = run_tenant(ctx, key, run_id)
    made = fork_run(ctx.client, run_id, at=body.at, tenant=tenant, into=key.tenant,
                    variant=Variant(params=body.params, goal=body.goal),
                    queue=body.queue)  # fmt: skip
    return {"run_id": made.run_id, "tenant": made.tenant, "forked_from": made.origin,
            "at_turn": made.turn, "created": made.created,
            "url": f"/v1/runs/{made.run_id}"}  # fmt: skip


@router.post("/v1/evals", status_code=202, tags=["evaluations"])
def start_eval(body: EvalBody, key: Operator, ctx: Ctx) -> dict[str, Any]:
    """Evaluate the tenant's finished runs on a variant, as runs of `eval_tenant`."""
    selection = evaluation.Selection(
        tenant=body.tenant, job=body.job, outcome=body.outcome,
        since_ms=evaluation.since_ms(body.since), limit=body.limit,
    )  # fmt: skip
    made = evaluation.start(
        ctx.client, selection, Variant(params=body.params, goal=body.goal), mode=body.mode,
        eval_tenant=body.eval_tenant, from_turn=body.from_turn, queue=body.queue,
    )  # fmt: skip
    return {"eval_id": made.eval_id, "tenant": made.tenant, "url": f"/v1/evals/{made.eval_id}"}


@router.get("/v1/evals/{eval_id}", tags=["evaluations"])
def show_eval(eval_id: EvalIdPath, key: Caller, ctx: Ctx) -> dict[str, Any]:
    """The evaluation's report: each run beside its original, and the totals."""
    said = evaluation.report(ctx.client, eval_id)
    if not key.operator and said["tenant"] != key.tenant:
        raise Problem(404, "evaluation_not_found", f"no evaluation {eval_id!r}")
    return said
