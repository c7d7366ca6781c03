"""The job example of docs/jobs.md ("A complete job", once the README's) is real code: it
defines a job that runs, asks for approval of its irreversible write, and charges its own
dimension; its tools return plain values and raise ToolError as the page says.
(tests/integration/test_outside_job.py runs it, with the page's client code, on a real
worker.)"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from turnstile.jobs.clock import SimClock
from turnstile.jobs.decisions import approve
from turnstile.jobs.errors import ParamsError
from turnstile.jobs.job import Job
from turnstile.jobs.kernel import Finished, Runtime, Suspended, run, turn
from turnstile.jobs.runs import new_run
from turnstile.jobs.trace import Trace

PAGE = Path(__file__).resolve().parents[2] / "docs" / "jobs.md"


def readme_code() -> tuple[str, str]:
    """The section's two Python blocks, as written: the job's module, and the client's code."""
    text = PAGE.read_text()
    start = text.index("## A complete job")
    section = text[start : text.index("\n## ", start + 1)]
    blocks = re.findall(r"```python\n(.*?)```", section, re.DOTALL)
    assert len(blocks) == 2, "the job's module, then the client's code"
    return blocks[0], blocks[1]


def readme_job() -> Job:
    namespace: dict[str, Any] = {"__name__": "readme_example"}
    exec(compile(readme_code()[0], "docs/jobs.md", "exec"), namespace)  # noqa: S102 - our docs
    job = namespace["credits"]()
    assert isinstance(job, Job)
    return job


def test_the_documented_job_runs_asks_approval_and_charges_its_dimension() -> None:
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


def test_the_documented_tools_return_plain_values_and_raise_tool_error() -> None:
    """get_balance's plain dict is the model's `ok` result, and its facts; an account it does
    not know is the ToolError the page raises, shown to the model as not_found."""
    job = readme_job()
    state = new_run(run_id="r1", tenant="t", user_id="u", job=job, goal="g",
                    params={"account": "acct_1"})  # fmt: skip
    clock = SimClock()
    rt = Runtime(job=job, model=job.own_model(state.params), clock=clock, trace=Trace(clock))
    turn(state, rt)  # the first turn reads the balance
    rt.close()
    assert state.facts == {"balance_cents": 1250}
    balance = state.last_result
    assert balance == {"status": "ok", "result": {"account": "acct_1", "balance_cents": 1250}}
    nobody = new_run(run_id="r2", tenant="t", user_id="u", job=job, goal="g",
                     params={"account": "nobody"})  # fmt: skip
    rt = Runtime(job=job, model=job.own_model(nobody.params), clock=clock, trace=Trace(clock))
    turn(nobody, rt)
    rt.close()
    assert nobody.last_result == {
        "status": "error", "code": "not_found", "detail": "no account nobody"
    }  # fmt: skip
