"""A provider's 429 is told to the process's listeners (the worker's shared buckets) with the
model string and the wait asked for; other failures are not, nor a call without a model
string."""

from __future__ import annotations

import pytest

from turnstile.jobs.model import ModelUnavailable
from turnstile.providers import retry
from turnstile.providers.retry import Failure, on_rate_limited, with_retries


def _failing(failure: Failure, spec: str | None) -> None:
    def attempt(_: float) -> str:
        raise RuntimeError("provider said no")

    with pytest.raises(ModelUnavailable):
        with_retries(attempt, lambda _: failure, timeout_s=5, max_attempts=2, spec=spec,
                     sleep=lambda _: None)  # fmt: skip


def test_a_429_is_told_to_every_listener_once_per_attempt() -> None:
    heard: list[tuple[str, float | None]] = []

    def listener(spec: str, wait_s: float | None) -> None:
        heard.append((spec, wait_s))

    def broken(spec: str, wait_s: float | None) -> None:
        raise ValueError("a listener's failure is not the call's")

    on_rate_limited(broken)
    on_rate_limited(listener)
    on_rate_limited(listener)  # registered once
    try:
        _failing(Failure("retry", "rate limited", wait_s=0.0, rate_limited=True), "openai:m")
        _failing(Failure("retry", "rate limited", wait_s=0.0, rate_limited=True), None)
        _failing(Failure("retry", "server error", wait_s=0.0), "openai:m")
    finally:
        retry._listeners.remove(listener)
        retry._listeners.remove(broken)
    assert heard == [("openai:m", 0.0), ("openai:m", 0.0)]
