"""A run's priority as every entry point checks it, and the broker priority a step is published
at (the dispatcher's order kept; fair share off, continuations first)."""

from __future__ import annotations

from typing import Any

import pytest

from turnstile.errors import SubmissionError
from turnstile.worker.broker.message import (
    CONTINUE_PRIORITY,
    DISPATCHED_PRIORITY,
    START_PRIORITY,
    StepMessage,
    publish_options,
)
from turnstile.worker.scheduling.priority import (
    DEFAULT,
    PriorityError,
    check_priority,
    stored_priority,
)


def test_every_whole_number_from_0_to_9_is_a_priority() -> None:
    assert [check_priority(p) for p in range(10)] == list(range(10))
    assert DEFAULT == 5


@pytest.mark.parametrize("bad", [10, -1, True, False, 5.0, "5", None, 2**70, "x\ny" * 40])
def test_anything_else_is_refused_in_one_line(bad: Any) -> None:
    with pytest.raises(PriorityError) as refused:
        check_priority(bad)
    assert isinstance(refused.value, SubmissionError)  # HTTP: 422 invalid_submission
    message = str(refused.value)
    assert message.startswith("priority must be a whole number from 0 to 9, not ")
    assert "\n" not in message and len(message) < 120


def test_a_stored_priority_reads_back_and_a_missing_one_is_the_default() -> None:
    assert stored_priority("7") == 7
    assert stored_priority(None) == stored_priority("") == stored_priority("12") == DEFAULT


def test_the_dispatcher_publishes_at_one_priority_and_other_senders_continuations_first() -> None:
    start, cont = StepMessage("t", "r", 1, "q"), StepMessage("t", "r", 2, "q")
    assert publish_options(start, 10, 12, dispatched=True)["priority"] == DISPATCHED_PRIORITY
    assert publish_options(cont, 10, 12, dispatched=True)["priority"] == DISPATCHED_PRIORITY
    assert publish_options(start, 10, 12)["priority"] == START_PRIORITY
    assert publish_options(cont, 10, 12)["priority"] == CONTINUE_PRIORITY
