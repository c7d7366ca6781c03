"""The pure pieces of live output: the final answer's words out of streamed arguments, the
cursor over a run's two streams and its checks, and how `watch --live` words an entry."""

from __future__ import annotations

import json

import pytest

from turnstile.jobs.live import NO_LIVE
from turnstile.jobs.model import ModelRequest, Scripted
from turnstile.providers.contract import AnswerText
from turnstile.worker.cli.runs import live_line
from turnstile.worker.http import sse
from turnstile.worker.http.problems import Problem
from turnstile.worker.store.live import Cursor, Entry


def test_an_answers_words_come_out_of_its_arguments_cut_anywhere() -> None:
    """Fed the arguments of a final answer cut at every character, the deltas join to its
    text exactly, escapes and surrogate pairs included, and never say a character twice."""
    text = 'Your refund of $30 is "on its way" \\ é\n😀 done.'
    arguments = json.dumps({"outcome": "completed", "text": text})
    answer = AnswerText()
    deltas = [answer.feed("final_answer", arguments[:cut]) for cut in range(len(arguments) + 1)]
    assert "".join(deltas) == text


def test_other_functions_and_what_is_not_json_say_nothing() -> None:
    """A tool call's arguments or a plan are not the answer; arguments that are not JSON
    (yet) give nothing, and the reply's parse says what is wrong with them."""
    answer = AnswerText()
    assert answer.feed("get_order", '{"text": "not an answer"}') == ""
    assert answer.feed("final_answer", "[1, 2") == ""
    assert answer.feed("final_answer", '{"text": 3}') == ""


def test_a_cursor_names_both_streams_and_resumes_each() -> None:
    """A cursor is `<event id>/<live id>`; an event id alone starts the live stream from its
    first entry; each entry read moves its own stream's half only."""
    cursor = Cursor.parse("17-0/18-2")
    assert cursor == Cursor("17-0", "18-2") and str(cursor) == "17-0/18-2"
    assert Cursor.parse("17-0") == Cursor("17-0", "0-0")
    assert Cursor.parse("17-0/x") is None and Cursor.parse("") is None
    assert cursor.past(Entry("19-0", {}, True, "{}")) == Cursor("17-0", "19-0")
    assert cursor.past(Entry("20-0", {}, False, "{}")) == Cursor("20-0", "18-2")


@pytest.mark.parametrize("bad", ["x", "1-2/3", "1-2/3-4/5-6", f"1-{2**64}/1-0"])
def test_a_bad_live_event_id_is_a_400_before_the_stream(bad: str) -> None:
    with pytest.raises(Problem) as refused:
        sse.check_cursor(bad)
    assert refused.value.status == 400


def test_watch_words_each_live_entry_on_one_line() -> None:
    """Tools starting and ending, a progress note and an abandoned attempt, as watch shows them."""
    assert live_line({"type": "tool_started", "call": "t2.c1", "tool": "get_order"}) == (
        "t2.c1 get_order started"
    )
    assert live_line({"type": "tool_ended", "call": "t2.c1", "tool": "get_order",
                      "status": "ok"}) == "t2.c1 get_order ended ok"  # fmt: skip
    assert live_line({"type": "progress", "call": "t2.c1", "tool": "get_order",
                      "note": "half\nway"}) == "t2.c1 get_order: half way"  # fmt: skip
    assert live_line({"type": "abandoned", "turn": 5, "attempt": 1, "reason": "killed"}) == (
        "turn 5 attempt 1 abandoned: killed"
    )


class Said:
    on = True

    def __init__(self) -> None:
        self.text_said: list[str] = []

    def text(self, delta: str) -> None:
        self.text_said.append(delta)


def test_a_scripted_model_says_its_final_answer_and_nothing_else() -> None:
    """`Scripted` says a final answer's text to a live sink that is on; a plan, or a sink that
    is off, hears nothing."""
    said = Said()
    model = Scripted(lambda view, step: {"type": "final", "outcome": "completed", "text": "hi"})
    model.next(ModelRequest("{}", 100, 10.0, 1, live=said))  # type: ignore[arg-type]
    assert said.text_said == ["hi"]
    planner = Scripted(lambda view, step: {"type": "plan", "steps": []})
    planner.next(ModelRequest("{}", 100, 10.0, 1, live=said))  # type: ignore[arg-type]
    assert said.text_said == ["hi"]
    model.next(ModelRequest("{}", 100, 10.0, 1, live=NO_LIVE))
