"""Deadline-bounded retries: the run's remaining time, not the SDK, decides when to give up.

Each attempt gets what is left of the call's timeout as its own timeout. A failure the provider
may get over (a rate limit, a 5xx, an overloaded server, a dropped connection) is retried after
the wait the provider asked for (`retry-after`) or a backoff, only if that wait still leaves
time before the deadline; one it will not get over (a bad key, a rejected request, an exhausted
quota) ends the run at once with a reason a person can act on. Retries that run out, or a wait
that would pass the deadline, raise `ModelUnavailable`: a run's fallback model may answer.

A rate limit (a 429) is also told to whoever listens (`on_rate_limited`, the worker's shared
buckets), with the model string and the wait asked for, so that no other turn of the fleet
calls that model before the wait is over.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from turnstile.backoff import backoff_s
from turnstile.jobs.model import ModelError, ModelStop, ModelTimeout, ModelUnavailable
from turnstile.jobs.outcomes import Outcome, Resource

T = TypeVar("T")

MAX_ATTEMPTS = 4  # a provider that fails four times running is down, not busy
BACKOFF_BASE_S = 0.5  # doubled per attempt when the provider names no wait
BACKOFF_MAX_S = 8.0
MAX_RETRY_AFTER_S = 120.0  # a longer wait asked for is not worth holding a worker for


@dataclass(frozen=True)
class Failure:
    """What one failed attempt means: retry (after `wait_s` if the provider named it), stop
    the run with `outcome`, or the call ran out of time."""

    kind: str  # "retry" | "stop" | "timeout"
    reason: str
    outcome: Outcome = Outcome.ERROR
    detail: str = "model"
    wait_s: float | None = None
    rate_limited: bool = False  # the provider's rate limit (a 429), not an outage


class StreamCut(ModelError):  # noqa: N818 - named for what happened to the stream
    """A provider's stream that ended before it said everything, or said what is not its wire
    format: the attempt failed as a reply cut in transit does, and is retried."""


def one_line(exc: BaseException, limit: int = 200) -> str:
    """An exception's text on one line, cut at `limit` characters."""
    return " ".join(str(exc).split())[:limit] or type(exc).__name__


RateLimited = Callable[[str, float | None], None]  # (model string, the wait asked for, if any)
_listeners: list[RateLimited] = []


def on_rate_limited(listener: RateLimited) -> None:
    """Call `listener` for every 429 a call of this process meets (once per listener)."""
    if listener not in _listeners:
        _listeners.append(listener)


def _told(spec: str, wait_s: float | None) -> None:
    for listener in list(_listeners):
        try:
            listener(spec, wait_s)
        except Exception:  # noqa: S112 - a listener's failure is not the call's
            continue


def retry_after_s(headers: Mapping[str, str] | None) -> float | None:
    """The wait a provider asked for: `retry-after-ms`, else `retry-after` in seconds."""
    if not headers:
        return None
    for name, scale in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            seconds = float(value) / scale
        except ValueError:
            continue  # an HTTP date: rare from these APIs; fall back to the backoff
        if 0 <= seconds <= MAX_RETRY_AFTER_S:
            return seconds
    return None


def with_retries(
    attempt: Callable[[float], T],
    classify: Callable[[Exception], Failure | None],
    *,
    timeout_s: float,
    max_attempts: int = MAX_ATTEMPTS,
    now: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    spec: str | None = None,
) -> T:
    """`attempt(timeout_s)` until it answers, within `timeout_s` in all. An exception that
    `classify` does not know (None) is raised as it is; a rate limit of model `spec` is told
    to the listeners (`on_rate_limited`)."""
    start = now()
    failure: Failure | None = None
    for number in range(1, max_attempts + 1):
        left = timeout_s - (now() - start)
        if left <= 0:
            raise ModelTimeout()
        try:
            return attempt(left)
        except Exception as exc:
            failure = classify(exc)
            if failure is None:
                raise
            if failure.kind == "timeout":
                raise ModelTimeout() from exc
            if failure.kind == "stop":
                raise ModelStop(failure.outcome, failure.reason, failure.detail) from exc
            if failure.rate_limited and spec:
                _told(spec, failure.wait_s)
        if number == max_attempts:
            break
        wait = (
            failure.wait_s
            if failure.wait_s is not None
            else backoff_s(number, base_s=BACKOFF_BASE_S, max_s=BACKOFF_MAX_S)
        )
        left = timeout_s - (now() - start)
        if wait >= left:
            raise ModelUnavailable(
                Outcome.BUDGET_EXHAUSTED,
                f"{failure.reason}; the wait of {wait:.1f} s before a retry is more than the"
                f" {max(0.0, left):.1f} s left before the deadline",
                Resource.DEADLINE.value,
            )
        sleep(wait)
    assert failure is not None
    raise ModelUnavailable(
        Outcome.TOOL_FAILURE, f"{failure.reason}; gave up after {max_attempts} attempts", "model"
    )
