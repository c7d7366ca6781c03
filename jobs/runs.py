"""Creating a run, and running one whole run in this process (tests, scenarios, replay)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from turnstile.jobs.budget import Budget
from turnstile.jobs.errors import ParamsError
from turnstile.jobs.job import Job
from turnstile.jobs.state import RunState

MAX_GOAL_CHARS = 4000
MAX_ID_CHARS = 128


def new_run(
    *,
    run_id: str,
    tenant: str,
    user_id: str,
    job: Job,
    goal: str,
    params: Mapping[str, Any] | None = None,
    budget: Budget | None = None,
    memory: list[str] | None = None,
    extendable: tuple[str, ...] = (),
) -> RunState:
    """A fresh run, checked before anything is written anywhere."""
    for name, value in (("run_id", run_id), ("tenant", tenant), ("user_id", user_id)):
        if not isinstance(value, str) or not value.strip():
            raise ParamsError(f"{name} must be a non-empty string")
        if len(value) > MAX_ID_CHARS or any(c in value for c in "{}\n\r\t "):
            raise ParamsError(
                f"{name} must be at most {MAX_ID_CHARS} characters, without braces or spaces"
            )
    if not isinstance(goal, str) or not goal.strip():
        raise ParamsError("goal must be a non-empty string")
    if len(goal) > MAX_GOAL_CHARS:
        raise ParamsError(f"goal is {len(goal)} characters; at most {MAX_GOAL_CHARS}")
    params = dict(params or {})
    job.validate_params(params)
    budget = budget or job.budget
    problems = budget.validate()
    if problems:
        raise ParamsError("budget: " + "; ".join(problems))
    return RunState(
        run_id=run_id,
        tenant=tenant,
        user_id=user_id,
        job=job.name,
        goal=goal,
        params=params,
        budget=budget,
        memory=list(memory or []),
        extendable=sorted(set(job.extendable) | set(extendable)),
        job_version=job.version,
    )
