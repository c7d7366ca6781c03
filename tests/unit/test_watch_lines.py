"""`turnstile watch`'s lines (worker/cli/render.py `describe`): a follow-up, a rate limit's wait,
a budget hold and a held call in words, each on one line; an event it has no words for as its
type and fields, never the raw JSON object."""

from __future__ import annotations

from turnstile.worker.cli.render import describe

BUDGET_HOLD = {
    "type": "suspended", "kind": "budget", "dimensions": ["tokens"],
    "spent": {"tokens": 280, "steps": 4}, "needed": {"tokens": 75, "steps": 1},
    "limits": {"tokens": 300, "steps": 40}, "suggested": {"tokens": 505}, "digest": "ef56",
    "reason": "the next turn does not fit the tokens budget", "at": "2025-01-01T00:00:00Z",
}  # fmt: skip


def test_a_follow_up_is_a_sentence_with_its_text() -> None:
    line = describe({"type": "followup", "at": "t",
                     "followup": {"text": "also, the box was wet", "at": "t"}})  # fmt: skip
    assert line == (
        "follow-up merged into the run (the model sees it from its next turn): "
        "'also, the box was wet'"
    )


def test_a_rate_limit_wait_says_how_long_until_when_and_that_it_holds_nothing() -> None:
    line = describe({"type": "rate_limited", "endpoint": "openai:gpt-4.1-mini", "limit": "rpm",
                     "wait_ms": 12_345, "until": "2025-01-01T00:00:12Z", "step": 3})  # fmt: skip
    assert line == (
        "waits 12.3 s for the rate limit of openai:gpt-4.1-mini (rpm), until "
        "2025-01-01T00:00:12Z, holding no worker; turn 3 goes then"
    )
    ended = describe({"type": "rate_limited", "endpoint": "openai:x", "limit": "tpm",
                      "wait_ms": 58_200, "ended": True})  # fmt: skip
    assert (
        ended == "the rate limit of openai:x (tpm) would make it wait 58.2 s, past its "
        "deadline: it ends"
    )


def test_a_budget_hold_says_spent_needed_and_suggested_and_how_to_go_on() -> None:
    line = describe(BUDGET_HOLD)
    assert line == (
        "held for a budget extension: the next turn does not fit the tokens budget. tokens: "
        "280 spent of a limit of 300, the next turn needs 75 more, suggested new limit 505. "
        "To go on: turnstile approve RUN --digest ef56 [--extend tokens=505]"
    )
    assert "\n" not in line and "{" not in line


def test_a_held_call_names_the_tool_its_arguments_and_why() -> None:
    line = describe({"type": "suspended", "kind": "call", "tool": "issue_refund",
                     "args": {"order_id": "ord_1004"}, "digest": "ab12",
                     "reason": "the tool asked for approval"})  # fmt: skip
    assert line == ('held for approval: issue_refund {"order_id": "ord_1004"} '
                    "(the tool asked for approval), digest ab12")  # fmt: skip


def test_conversation_events_are_sentences() -> None:
    assert describe({"type": "superseded", "by_run": "run_b"}) == (
        "superseded by run run_b of its conversation"
    )
    assert describe({"type": "interrupt_requested", "by_run": "run_b"}) == (
        "run run_b of its conversation interrupts it: it stops at its next turn"
    )
    assert describe({"type": "started", "after": "run_a", "conversation": "c"}) == (
        "started: run run_a of its conversation ended before it"
    )
    assert describe({"type": "followups_unseen", "followups": [{"text": "x"}]}) == (
        "1 follow-up(s) came after its last turn: the model never saw them"
    )


def test_an_event_without_words_is_its_type_and_fields_on_one_line() -> None:
    line = describe({"type": "weather", "at": "t", "sky": "grey", "wind": {"kmh": 12}})
    assert line == 'weather: sky grey, wind {"kmh": 12}'
