"""The kernel's side of conversations: the policies a job may declare, follow-ups in the state
and in the model's view (for a job with a view of its own too), and the `superseded` ending."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from tests.unit.kit import Listed, World, make_job, read_tool
from turnstile.jobs.clock import SimClock
from turnstile.jobs.closing import closing_message
from turnstile.jobs.conversations import (
    POLICIES,
    ConversationPolicy,
    policy_problem,
    receive,
    start,
    supersede,
)
from turnstile.jobs.errors import JobDefinitionError
from turnstile.jobs.job import Job
from turnstile.jobs.kernel import Runtime, turn
from turnstile.jobs.outcomes import TERMINAL, Outcome, Status
from turnstile.jobs.runs import new_run
from turnstile.jobs.state import FollowUp, RunState
from turnstile.jobs.support.job import support_job
from turnstile.jobs.support.shop import InMemoryShop
from turnstile.jobs.trace import Trace

WET = FollowUp(text="also, the box was wet", at="2026-12-02T10:00:00.000+00:00")


def _state(job_view: Callable[[RunState], str] | None = None) -> tuple[RunState, Job]:
    tools = [read_tool(World())]
    job = make_job(tools) if job_view is None else make_job(tools, render=job_view)
    state = new_run(run_id="r1", tenant="t", user_id="u", job=job, goal="refund ord_1001")
    state.conversation = "chat-1"
    return state, job


def test_the_policies_and_the_jobs_defaults() -> None:
    assert POLICIES == ("reject", "enqueue", "interrupt", "merge")
    assert policy_problem("merge") is None
    assert policy_problem("Merge") == (
        "unknown conversation policy 'Merge'; one of reject, enqueue, interrupt, merge"
    )
    assert policy_problem(None) is not None
    assert make_job([]).conversation_policy is ConversationPolicy.REJECT
    assert support_job(InMemoryShop()).conversation_policy is ConversationPolicy.MERGE
    assert make_job([], conversation_policy="enqueue").conversation_policy == "enqueue"
    with pytest.raises(JobDefinitionError, match="unknown conversation policy 'later'"):
        make_job([], conversation_policy="later")


def test_follow_ups_are_in_the_default_view_in_order() -> None:
    state, job = _state()
    assert "followups" not in json.loads(job.view(state))
    later = FollowUp(text="and it was late", at="2026-12-02T10:01:00.000+00:00", id="run_x")
    receive(state, [WET])
    receive(state, [later])
    view = json.loads(job.view(state))
    assert view["followups"] == [WET.text, later.text]
    assert view["goal"] == "refund ord_1001"
    assert RunState.from_json(state.to_json()).followups == [WET, later]


def test_a_jobs_own_view_gets_the_follow_ups_whether_json_or_text() -> None:
    state, job = _state(lambda s: json.dumps({"task": s.goal}))
    receive(state, [WET])
    assert json.loads(job.view(state)) == {
        "task": "refund ord_1001", "followups": [WET.text],
    }  # fmt: skip
    state, job = _state(lambda s: f"Task: {s.goal}")
    receive(state, [WET])
    shown = job.view(state)
    assert shown.startswith("Task: refund ord_1001\n\n")
    assert shown.endswith(f"oldest first:\n- {WET.text}")
    state, job = _state(lambda s: f"Task: {s.goal}; {' '.join(f.text for f in s.followups)}")
    receive(state, [WET])
    assert job.view(state) == f"Task: refund ord_1001; {WET.text}"


def test_the_model_is_asked_with_the_follow_up_in_its_view() -> None:
    """The turn renders through `Job.view`: the model's request carries the follow-up."""
    model = Listed([])  # a final answer
    state, job = _state(lambda s: f"Task: {s.goal}")
    receive(state, [WET])
    clock = SimClock()
    turn(state, Runtime(job=job, model=model, clock=clock, trace=Trace(clock)))
    asked = model.requests
    assert WET.text in asked[0].view


def test_superseded_is_terminal_and_says_why() -> None:
    state, job = _state()
    state.status = Status.WAITING
    start(state)
    assert state.status is Status.RUNNING
    supersede(state, by_run="run_new", at="2026-12-02T10:02:00.000+00:00")
    assert (state.status, state.outcome) == (Status.STOPPED, Outcome.SUPERSEDED)
    assert state.reason == "interrupted by run run_new of conversation chat-1"
    assert Outcome.SUPERSEDED in TERMINAL
    assert closing_message(state, job).startswith("We stopped working on this request")
