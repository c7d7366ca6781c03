"""The shape of a provider rate limit's bucket (worker/scheduling/ratelimits.py `shape`, the
same arithmetic as rl_lib.lua's rl_shape): a burst of `burst_s` seconds' worth at once, and a
refill that keeps any window shorter than 60 + SLACK_S seconds at the limit, so a provider that
counts a sliding minute, or a bucket of its own with at least the burst, never sees more."""

from __future__ import annotations

import re
from bisect import bisect_right
from pathlib import Path

import pytest

from turnstile.worker.scheduling import ratelimits
from turnstile.worker.scheduling.ratelimits import SLACK_S, shape

LUA = Path(ratelimits.__file__).parents[1] / "store" / "lua" / "rl_lib.lua"


def greedy(limit: int, burst_s: int, seconds: float, step_s: float = 0.01) -> list[float]:
    """When a sender that sends whenever its bucket lets it sends, over `seconds`."""
    cap, per_ms = shape(limit, burst_s)
    level, sent, t = float(cap), [], 0.0
    while t < seconds:
        while level >= 1:
            level -= 1
            sent.append(t)
        t += step_s
        level = min(cap, level + step_s * 1000 * per_ms)
    return sent


@pytest.mark.parametrize("limit", [1, 2, 3, 40, 60, 600, 10_000])
@pytest.mark.parametrize("burst_s", [0, 1, 5, 30])
def test_no_sliding_minute_holds_more_than_the_limit_even_a_second_late(
    limit: int, burst_s: int
) -> None:
    """A sender that sends as soon as the bucket lets it, for three minutes: every window of
    60 s, and of 60 s plus all but a hair of the slack, holds at most the limit."""
    sent = greedy(limit, burst_s, 180.0)
    for i, t in enumerate(sent):
        stretched = 60.0 + SLACK_S - 0.02
        first = bisect_right(sent, t - stretched)
        assert i + 1 - first <= limit, (t, i + 1 - first)


@pytest.mark.parametrize(("limit", "burst_s", "burst"), [
    (40, 1, 1), (40, 0, 1), (1, 30, 1), (600, 1, 10), (600, 30, 300), (60, 3, 3),
])  # fmt: skip
def test_the_burst_goes_at_once_and_the_rest_of_the_minute_refills(
    limit: int, burst_s: int, burst: int
) -> None:
    """`burst_s` seconds' worth (at least one request) goes at once; over a long time the pace
    is limit - burst + 1 per 61 s, a few percent under the limit."""
    cap, per_ms = shape(limit, burst_s)
    assert cap == burst
    sent = greedy(limit, burst_s, 0.005)
    assert len(sent) == burst
    pace_per_min = per_ms * 60_000
    assert pace_per_min == pytest.approx((limit - burst + 1) * 60 / (60 + SLACK_S))
    assert pace_per_min <= limit


def test_the_lua_library_keeps_the_same_defaults() -> None:
    """rl_lib.lua's default burst and slack are the Python module's (a bucket set without a
    burst is shaped by the Lua's)."""
    source = LUA.read_text()
    burst = re.search(r"^local RL_BURST_S = (\d+)$", source, re.M)
    slack = re.search(r"^local RL_SLACK_S = (\d+)$", source, re.M)
    assert burst and slack
    assert (int(burst[1]), int(slack[1])) == (ratelimits.DEFAULT_BURST_S, SLACK_S)
