"""The step's order of gates and its results: the gates run in their order until one does not
answer go, and a step says the same words it always said."""

from __future__ import annotations

from typing import cast

from turnstile.worker.observability.metrics import _ENDS_RUN
from turnstile.worker.runtime import gates
from turnstile.worker.runtime.gates import GO, End, Gate, Turn, Verdict, Wait, through
from turnstile.worker.runtime.results import RUN_ENDED, StepResult

# What `Step.run` returned, and the task, the log and the metrics read, before it was a type.
WORDS = {
    "continued", "suspended", "finished", "deferred", "refused", "cancelled", "superseded",
    "parked", "broken", "poison", "missing", "stale", "idle", "busy", "commit_missing",
    "commit_ledger", "commit_busy", "commit_moved", "ledger", "moved",
}  # fmt: skip


def _gate(name: str, answer: Verdict, seen: list[str]) -> Gate:
    def gate(turn: Turn) -> Verdict:
        seen.append(name)
        return answer

    return gate


def test_the_gates_run_in_order_until_one_does_not_go() -> None:
    """Each gate that answers go hands the turn to the next; the first that ends or waits is
    the answer, and no gate after it runs."""
    seen: list[str] = []
    order = [
        _gate("first", GO, seen),
        _gate("second", Wait(StepResult.PARKED), seen),
        _gate("third", End(StepResult.CANCELLED), seen),
    ]
    assert through(cast(Turn, None), order) == Wait(StepResult.PARKED)
    assert seen == ["first", "second"]


def test_a_turn_every_gate_lets_go_goes_on() -> None:
    """When every gate answers go there is no answer: the step runs the turn."""
    seen: list[str] = []
    assert through(cast(Turn, None), [_gate("a", GO, seen), _gate("b", GO, seen)]) is None
    assert seen == ["a", "b"]


def test_the_gates_order_is_the_one_the_step_documents() -> None:
    """A cancel, an interrupt, a pause, the run's job version and the model come before
    admission; the soft ceilings and the rate limit look at the hold admission took, in that
    order."""
    assert (
        gates.cancel_requested,
        gates.interrupted,
        gates.paused,
        gates.versioned,
        gates.model_built,
        gates.admission,
        gates.soft_ceilings,
        gates.rate_limit,
    ) == gates.GATES


def test_a_step_says_the_words_it_always_said() -> None:
    """Every result is one of the words a step returned as a string, and reads as that word
    in a log line or a metric's label."""
    assert {r.value for r in StepResult} == WORDS
    assert all(str(r) == r.value == f"{r}" for r in StepResult)
    assert StepResult("continued") is StepResult.CONTINUED


def test_the_results_that_end_a_run_are_those_the_slot_and_the_metrics_know() -> None:
    """A step's fair-share slot is given back for good after the results that end its run, and
    the metrics count a run finished for those that bypass the commit's own count."""
    assert {str(r) for r in RUN_ENDED} == {
        "finished", "refused", "cancelled", "superseded", "broken", "poison", "missing",
    }  # fmt: skip
    assert set(_ENDS_RUN) <= {str(r) for r in RUN_ENDED}
