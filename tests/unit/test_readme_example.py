"""The README's job example is real code: it defines a job that runs, asks for approval of its
irreversible write, and charges its own dimension."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from turnstile.jobs.clock import SimClock
from turnstile.jobs.decisions import approve
from turnstile.jobs.errors import ParamsError
from turnstile.jobs.job import Job
from turnstile.jobs.kernel import Finished, Runtime, Suspended, run
from turnstile.jobs.runs import new_run
from turnstile.jobs.trace import Trace

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_job() -> Job:
    text = README.read_text()
    section = text[text.index("## Writing a job") :]
    code = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert code is not None
    namespace: dict[str, Any] = {"__name__": "readme_example"}
    exec(compile(code.group(1), "README.md", "exec"), namespace)  # noqa: S102 - our own README
    job = namespace["credits"]()
    assert isinstance(job, Job)
    return job


def test_the_readme_job_runs_asks_approval_and_charges_its_dimension() -> None:
    """The example suspends for its irreversible credit, then completes when approved, with
    the credit charged to credit_cents; an unknown param is refused naming it."""
    job = readme_job()
    with pytest.raises(ParamsError, match=r"params\.acount: unknown key for job .credits."):
        new_run(run_id="r1", tenant="t", user_id="u", job=job, goal="g", params={"acount": "a"})
    with pytest.raises(ParamsError, match=r"params\.account: required by job 'credits'"):
        new_run(run_id="r1", tenant="t", user_id="u", job=job, goal="g", params={})
    state = new_run(run_id="r1", tenant="t", user_id="u", job=job, goal="credit acct_1",
                    params={"account": "acct_1"})  # fmt: skip
    clock = SimClock()
    rt = Runtime(job=job, model=job.own_model(state.params), clock=clock, trace=Trace(clock))
    assert isinstance(run(state, rt), Suspended)
    approve(state, by="alice", at="now")
    move = run(state, rt)
    rt.close()
    assert isinstance(move, Finished) and move.outcome.value == "completed"
    assert state.usage.extra == {"credit_cents": 1000}
