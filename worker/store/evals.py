"""Evaluations: each one a record of its tenant's, so an interrupted evaluation resumes where it
stopped and submits each origin's run once.

    turnstile:{E}:eval:<id>        hash: spec (JSON), status, created_at
    turnstile:{E}:eval-runs:<id>   hash: origin run id -> the evaluation's run
    turnstile:{E}:evals            zset: the tenant's evaluation ids by creation (ms)
    turnstile:eval-tenants         hash: evaluation id -> tenant (an id alone finds it)
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import msgspec
import redis

from turnstile.worker.store import keys
from turnstile.worker.store.values import text


@dataclass(frozen=True)
class Stored:
    eval_id: str
    tenant: str
    spec: dict[str, Any]
    status: str
    created_at: str
    runs: dict[str, str]  # origin -> the evaluation's run


def create(client: redis.Redis, tenant: str, eval_id: str, spec: dict[str, Any], at: str) -> bool:
    """Store a new evaluation (status `submitting`); False if the id is taken."""
    if not client.hsetnx(keys.EVAL_TENANTS, eval_id, tenant):
        return False
    pipe = client.pipeline(transaction=True)
    pipe.hset(keys.evaluation(tenant, eval_id), mapping={
        "spec": msgspec.json.encode(spec), "status": "submitting", "created_at": at,
    })  # fmt: skip
    pipe.zadd(keys.evaluations(tenant), {eval_id: int(time.time() * 1000)})
    pipe.execute()
    return True


def tenant_of(client: redis.Redis, eval_id: str) -> str | None:
    found = client.hget(keys.EVAL_TENANTS, eval_id)
    return None if found is None else text(found)


def add_run(client: redis.Redis, tenant: str, eval_id: str, origin: str, run_id: str) -> None:
    client.hset(keys.evaluation_runs(tenant, eval_id), origin, run_id)


def set_status(client: redis.Redis, tenant: str, eval_id: str, status: str) -> None:
    client.hset(keys.evaluation(tenant, eval_id), "status", status)


def load(client: redis.Redis, tenant: str, eval_id: str) -> Stored | None:
    pipe = client.pipeline(transaction=False)
    pipe.hgetall(keys.evaluation(tenant, eval_id))
    pipe.hgetall(keys.evaluation_runs(tenant, eval_id))
    record, runs = pipe.execute()
    if not record:
        return None
    fields = {text(k): text(v) for k, v in record.items()}
    return Stored(
        eval_id, tenant, msgspec.json.decode(fields.get("spec", "{}")), fields.get("status", ""),
        fields.get("created_at", ""), {text(k): text(v) for k, v in runs.items()},
    )  # fmt: skip


def listed(client: redis.Redis, tenant: str, limit: int = 100) -> list[str]:
    """The tenant's evaluation ids, newest first."""
    return [text(v) for v in client.zrevrange(keys.evaluations(tenant), 0, limit - 1)]
