"""A webhook endpoint's breaker, on a simulated clock: when it opens, what it lets start while
open and half-open, and what closes it."""

from __future__ import annotations

from turnstile.worker.http.breaker import Breaker, Circuit


def _failed(breaker: Breaker, times: int, now_ms: int) -> Circuit:
    state = breaker.state(now_ms)
    for _ in range(times):
        state = breaker.finished(ok=False, now_ms=now_ms, trial=False)
    return state


def test_it_opens_after_the_failures_in_a_row_and_lets_nothing_start() -> None:
    """Below the threshold it stays closed and lets any number start; at the threshold it is
    open and lets none start until the cool-down has passed."""
    breaker = Breaker(failures_to_open=3, cooldown_ms=1000)
    assert _failed(breaker, 2, now_ms=0) is Circuit.CLOSED and breaker.allowed(0) is None
    assert _failed(breaker, 1, now_ms=10) is Circuit.OPEN
    assert breaker.allowed(10) == 0 and breaker.allowed(1009) == 0 and not breaker.started(500)


def test_a_success_between_failures_starts_the_count_again() -> None:
    """Failures count only in a row: one success in between resets them."""
    breaker = Breaker(failures_to_open=2, cooldown_ms=1000)
    _failed(breaker, 1, now_ms=0)
    breaker.finished(ok=True, now_ms=1, trial=False)
    assert _failed(breaker, 1, now_ms=2) is Circuit.CLOSED and breaker.failures == 1


def test_after_the_cool_down_one_trial_goes_and_its_success_closes_it() -> None:
    """Half-open after the cool-down: one delivery starts as the trial, none beside it while
    it is in flight, and its success closes the breaker."""
    breaker = Breaker(failures_to_open=1, cooldown_ms=1000)
    _failed(breaker, 1, now_ms=0)
    assert breaker.state(1000) is Circuit.HALF_OPEN and breaker.allowed(1000) == 1
    assert breaker.started(1000) and breaker.allowed(1001) == 0 and not breaker.started(1001)
    assert breaker.finished(ok=True, now_ms=1500, trial=True) is Circuit.CLOSED
    assert breaker.allowed(1500) is None and breaker.failures == 0


def test_a_failed_trial_opens_it_for_another_cool_down() -> None:
    """The trial's failure opens the breaker again from when it failed."""
    breaker = Breaker(failures_to_open=2, cooldown_ms=1000)
    _failed(breaker, 2, now_ms=0)
    assert breaker.started(1000)
    assert breaker.finished(ok=False, now_ms=1300, trial=True) is Circuit.OPEN
    assert breaker.allowed(2299) == 0 and breaker.state(2300) is Circuit.HALF_OPEN


def test_a_trial_abandoned_without_an_attempt_lets_the_next_one_try() -> None:
    """A trial whose delivery was gone made no attempt: the breaker stays half-open for the
    next delivery to be the trial."""
    breaker = Breaker(failures_to_open=1, cooldown_ms=10)
    _failed(breaker, 1, now_ms=0)
    assert breaker.started(10)
    breaker.abandoned()
    assert breaker.state(11) is Circuit.HALF_OPEN and breaker.started(11)
