"""The console's evaluation pages: a tenant's evaluations, and one evaluation's report (each run
beside its original, and the totals), read through `ops/evaluate.py` as `turnstile eval show`
and `GET /v1/evals/{id}` read them."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import Response

from turnstile.worker.http.console.render import Seen, console_of, listing_scope, opt, render
from turnstile.worker.http.context import NAME
from turnstile.worker.ops import evaluate as evaluation
from turnstile.worker.ops.errors import EvaluationNotFoundError
from turnstile.worker.store import evals

router = APIRouter()


@router.get("/evals")
def evaluations(
    request: Request, viewer: Seen, tenant: Annotated[str | None, Query(max_length=128)] = None
) -> Response:
    """The evaluations charged to a tenant (the viewer's own; an operator's `tenant`)."""
    client = console_of(request).api.client
    scope = listing_scope(viewer, opt(tenant)) or viewer.key.tenant
    shown: list[dict[str, Any]] = []
    for eval_id in evals.listed(client.client, scope):
        said = evaluation.report(client, eval_id)
        shown.append({"eval_id": eval_id, "status": said["status"], "spec": said["spec"],
                      "created_at": said["created_at"], "totals": said["totals"]})  # fmt: skip
    return render(request, "evals.html", viewer=viewer, tenant=scope, evals=shown)


@router.get("/evals/{eval_id}")
def evaluation_page(
    request: Request, viewer: Seen, eval_id: Annotated[str, Path(pattern=NAME)]
) -> Response:
    """One evaluation's report; another tenant's is not found."""
    said = evaluation.report(console_of(request).api.client, eval_id)
    if not viewer.operator and said["tenant"] != viewer.key.tenant:
        raise EvaluationNotFoundError(f"no evaluation {eval_id!r}")
    return render(request, "eval.html", viewer=viewer, report=said)
