"""The adapters streaming (a live sink on) against the wire servers' streaming formats: the
answer's words said as they come join to the committed answer, the ledger holds exactly the
provider's usage as it does without streaming, and a stream cut mid-way (the connection dropped,
a chunk that is not JSON) is retried as a reply cut in transit is, its words abandoned."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from tests.integration import test_providers as plain
from tests.wire.wire import wire_server
from turnstile.jobs.moves import Finished
from turnstile.jobs.outcomes import Outcome

pytestmark = pytest.mark.integration

BOTH, EMAIL_COST_MICROUSD = plain.BOTH, plain.EMAIL_COST_MICROUSD
ledger, run_on = plain.ledger, plain.run_on  # the same runs as without streaming, and ledger


class Heard:
    """A live sink that keeps what it is told, in order."""

    on = True

    def __init__(self) -> None:
        self.said: list[tuple[str, ...]] = []
        self.lock = threading.Lock()

    def _add(self, *entry: str) -> None:
        with self.lock:
            self.said.append(entry)

    def text(self, delta: str) -> None:
        self._add("text", delta)

    def tool_started(self, call: str, tool: str) -> None:
        self._add("tool_started", call, tool)

    def tool_ended(self, call: str, tool: str, status: str) -> None:
        self._add("tool_ended", call, tool, status)

    def progress(self, call: str, tool: str, note: str) -> None:
        self._add("progress", call, tool, note)

    def abandon(self, reason: str) -> None:
        self._add("abandoned", reason)

    def text_kept(self) -> str:
        """The words a reader keeps: each abandon drops those before it."""
        kept: list[str] = []
        for entry in self.said:
            if entry[0] == "abandoned":
                kept = []
            elif entry[0] == "text":
                kept.append(entry[1])
        return "".join(kept)


@pytest.mark.parametrize("provider", BOTH)
def test_streamed_words_join_to_the_answer_and_the_ledger_is_the_providers_usage(
    provider: str, run_on: Any
) -> None:
    """A whole support run streamed: the final answer's words arrive in several pieces that
    join to the committed answer; every tool call is said started and ended; the ledger's
    tokens and cost are the provider's usage at the table's prices, as without streaming; and
    the run replays from its spans to the identical state."""
    heard = Heard()
    with wire_server(provider, "support_run") as wire:
        run = run_on(wire, heard)
        move = run.until_done()
        assert all(r["body"].get("stream") is True for r in wire.received())
        tokens, cost = wire.billed()
        assert run.committed() == (tokens, cost + EMAIL_COST_MICROUSD)
    assert isinstance(move, Finished) and run.state.outcome is Outcome.COMPLETED
    pieces = [e[1] for e in heard.said if e[0] == "text"]
    assert len(pieces) > 3 and "".join(pieces) == heard.text_kept() == run.state.answer
    started = [e[2] for e in heard.said if e[0] == "tool_started"]
    ended = [(e[2], e[3]) for e in heard.said if e[0] == "tool_ended"]
    assert started == ["get_order", "issue_refund", "send_status_email"]
    assert ended == [(name, "ok") for name in started]


@pytest.mark.parametrize("provider", BOTH)
def test_a_stream_cut_or_malformed_is_retried_and_its_words_abandoned(
    provider: str, run_on: Any
) -> None:
    """A stream whose connection drops half-way, then one with a chunk that is not JSON, are
    each retried as a cut reply is; the words they said are abandoned, the third stream's
    words are the answer, and only the answer that arrived whole is charged."""
    heard = Heard()
    with wire_server(provider, "stream_cut") as wire:
        run = run_on(wire, heard)
        run.turn()
        assert len(wire.received()) == 3
        assert run.committed() == wire.billed()
    assert [e[0] for e in heard.said].count("abandoned") == 2
    assert heard.text_kept() == run.state.answer
    assert run.state.answer and run.state.answer in "".join(e[1] for e in heard.said)


def test_a_finished_stream_without_its_usage_chunk_is_charged_as_a_reply_without_usage(
    run_on: Any,
) -> None:
    """An OpenAI-compatible server that finishes its stream without the usage chunk (one that
    ignores `stream_options`): the reply stands and the turn is charged the kernel's estimate,
    as a reply without usage is when not streamed; nothing is abandoned."""
    heard = Heard()
    with wire_server("openai", "stream_no_usage") as wire:
        run = run_on(wire, heard)
        run.turn()
        assert len(wire.received()) == 1
    tokens, _ = run.committed()
    assert tokens == run.state.usage.tokens > 0
    assert heard.text_kept() == run.state.answer
    assert "abandoned" not in [e[0] for e in heard.said]


@pytest.mark.parametrize(
    ("provider", "scenario"),
    [(p, s) for p, scenarios in plain.RETRIED.items() for s in scenarios],
)
def test_streamed_a_rate_limit_a_server_error_or_a_cut_reply_is_retried(
    provider: str, scenario: str, run_on: Any
) -> None:
    """The retried scenarios of test_providers.py asked streaming: a 429, a 5xx or a 529
    before any stream, or a stream cut in transit, are retried as without streaming, and only
    the answer that arrived is charged."""
    with wire_server(provider, scenario) as wire:
        run = run_on(wire, Heard())
        run.turn()
        assert [r["body"].get("stream") for r in wire.received()] == [True, True]
        assert run.committed() == wire.billed()
    assert [s.id for s in run.state.plan] == ["s1", "s2", "s3"]


@pytest.mark.parametrize(("provider", "scenario", "outcome", "detail"), plain.STOPS)
def test_streamed_a_refusal_or_a_request_that_cannot_succeed_ends_the_run(
    provider: str, scenario: str, outcome: Outcome, detail: str, run_on: Any
) -> None:
    """The stopping scenarios asked streaming end the run as they do without: the same
    outcome and detail after one attempt, charged what the provider billed."""
    with wire_server(provider, scenario) as wire:
        run = run_on(wire, Heard())
        move = run.turn()
        assert len(wire.received()) == 1
        assert run.committed() == wire.billed()
    assert isinstance(move, Finished) and (move.outcome, move.detail) == (outcome, detail)
