"""A step's publish options: the headers' argument texts Turnstile makes for Celery are the
ones Celery would have made."""

from __future__ import annotations

from celery import Celery
from hypothesis import given
from hypothesis import strategies as st

from turnstile.worker.broker.message import MAX_TRACEPARENT_CHARS, StepMessage, publish_options

_APP = Celery("t", set_as_current=False)

_messages = st.builds(
    StepMessage,
    tenant=st.text(min_size=1, max_size=600),
    run_id=st.text(min_size=1, max_size=600),
    version=st.integers(min_value=1, max_value=2**40),
    queue=st.text(min_size=1, max_size=64),
    traceparent=st.text(max_size=MAX_TRACEPARENT_CHARS),
)


@given(_messages)
def test_the_argument_texts_are_celerys_own(msg: StepMessage) -> None:
    """`argsrepr` and `kwargsrepr` in the task message's headers read as Celery's `saferepr`
    makes them when it is left to, for any step a message can carry (any text, any version),
    and plain ones (a printable name, a run id, a trace parent) are made by Turnstile."""
    options = publish_options(msg, 10.0, 12.0)
    made = _APP.amqp.create_task_message(
        "id", "step", (), options["kwargs"],
        argsrepr=options.get("argsrepr"), kwargsrepr=options.get("kwargsrepr"),
    )  # fmt: skip
    celerys = _APP.amqp.create_task_message("id", "step", (), options["kwargs"])
    for key in ("argsrepr", "kwargsrepr"):
        assert made.headers[key] == celerys.headers[key]


def test_a_plain_steps_texts_are_made_here() -> None:
    options = publish_options(StepMessage("acme", "run_1", 3, "support", "00-ab-cd-01"), 10, 12)
    assert options["argsrepr"] == "()"
    assert options["kwargsrepr"] == repr(options["kwargs"])
