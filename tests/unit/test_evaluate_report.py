"""The pure parts of an evaluation (worker/ops/evaluate.py): `--since` as an ISO time or an
age, the first turn whose model reply differs, and the totals set side by side."""

from __future__ import annotations

from typing import Any

import pytest

from turnstile.worker.ops import evaluate as evaluation
from turnstile.worker.ops.errors import ControlError

NOW_S = 1_764_840_000.0  # 2025-12-04T09:20:00Z


def test_since_is_an_iso_time_or_an_age() -> None:
    assert evaluation.since_ms(None) == 0
    assert evaluation.since_ms("2h", NOW_S) == int((NOW_S - 7200) * 1000)
    assert evaluation.since_ms("7d", NOW_S) == int((NOW_S - 7 * 86400) * 1000)
    assert evaluation.since_ms("2025-12-04T09:00:00Z") == int((NOW_S - 1200) * 1000)
    with pytest.raises(ControlError, match=r"an ISO time .* or an age"):
        evaluation.since_ms("yesterday")


def test_the_first_divergent_turn_is_the_first_reply_that_differs_after_the_start() -> None:
    original = {1: "plan", 2: "read", 3: "refund", 4: "email", 5: "final"}
    assert evaluation.first_divergence(original, dict(original), 0) is None
    assert evaluation.first_divergence(original, {**original, 3: "refund 5000"}, 0) == 3
    assert evaluation.first_divergence(original, {1: "plan", 2: "read"}, 0) == 3  # it stopped
    assert evaluation.first_divergence(original, {4: "email", 5: "final"}, 3) is None


def test_the_totals_count_changed_outcomes_and_cost_per_completed_run() -> None:
    def side(outcome: str, cost: int, turns: int) -> dict[str, Any]:
        return {"run_id": "r", "status": "stopped", "outcome": outcome, "turns": turns,
                "tool_calls": 3, "tokens": 100, "cost_microusd": cost}  # fmt: skip

    rows: list[dict[str, Any]] = [
        {"origin": "a", "original": side("completed", 100, 5),
         "variant": {**side("completed", 300, 5), "held_writes": 1}, "first_divergent_turn": 3},
        {"origin": "b", "original": side("completed", 100, 5),
         "variant": {**side("loop_detected", 500, 9), "held_writes": 0},
         "first_divergent_turn": 1},
        {"origin": "c", "original": side("completed", 100, 5), "variant": None, "skipped": "x"},
    ]  # fmt: skip
    totals = evaluation.totals(rows)
    assert (totals["runs"], totals["evaluated"], totals["skipped"]) == (3, 2, 1)
    assert (totals["outcomes_changed"], totals["diverged"], totals["held_writes"]) == (1, 2, 1)
    assert totals["original"]["cost_per_completed_run_microusd"] == 100
    assert totals["variant"]["cost_per_completed_run_microusd"] == 800  # all spend / 1 completed
    assert totals["variant"]["turns_per_run"] == 7
    assert totals["variant"]["outcomes"] == {"completed": 1, "loop_detected": 1}
