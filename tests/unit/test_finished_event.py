"""A stopped run's `finished` event, built by the kernel without I/O (jobs/closing.py)."""

from __future__ import annotations

import msgspec

from tests.unit.kit import World, make_job, read_tool
from turnstile.jobs.closing import closing_message, closing_without_state, finished_event
from turnstile.jobs.kernel import finish
from turnstile.jobs.outcomes import Outcome
from turnstile.jobs.runs import new_run

AT = "2026-12-02T10:00:00.000+00:00"


def test_the_finished_event_carries_the_closing_message_and_the_usage() -> None:
    """A run that stops gets its outcome, detail, reason, answer, usage and time, and the
    closing message from its state and job; a job this process does not know gets the
    outcome's opening alone."""
    job = make_job([read_tool(World())])
    state = new_run(run_id="r1", tenant="t", user_id="u", job=job, goal="refund ord_1001")
    finish(state, Outcome.CANCELLED, "asked by ops")
    event = finished_event(state, job, reason="asked by ops", at=AT)
    assert event == {
        "type": "finished", "outcome": "cancelled", "detail": None, "reason": "asked by ops",
        "answer": None, "message": closing_message(state, job),
        "usage": msgspec.to_builtins(state.usage), "at": AT,
    }  # fmt: skip
    unknown = finished_event(state, None, reason="asked by ops", at=AT)
    assert unknown["message"] == closing_without_state(Outcome.CANCELLED)


def test_a_state_that_cannot_be_read_ends_in_error_with_its_reason() -> None:
    """No state: the event says `error`, the reason given, and nothing it cannot know."""
    event = finished_event(None, None, reason="state unreadable", at=AT)
    assert (event["outcome"], event["reason"], event["usage"], event["answer"]) == (
        "error",
        "state unreadable",
        None,
        None,
    )
    assert event["message"] == closing_without_state(Outcome.ERROR)
