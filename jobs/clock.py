"""Clocks the kernel is given. It has none of its own.

Time in a run is *active* time: model and tool latency, never time spent waiting for a person.
A clock's `now()` is only read to time calls that do not report their own latency and to stamp
trace spans; `advance()` accounts for latency that was reported rather than lived through.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float: ...

    def advance(self, seconds: float) -> None: ...


class SimClock:
    """Simulated time: only `advance` moves it, so runs are deterministic and instant."""

    def __init__(self, start_s: float = 0.0) -> None:
        self._t = start_s

    def now(self) -> float:
        return self._t

    def advance(self, seconds: float) -> None:
        self._t = round(self._t + seconds, 6)


class ActiveClock:
    """Real time on a monotonic clock, offset so that it starts at the run's active time so far.

    Reported (simulated) latency moves it forward too, so a simulated job timed on a real worker
    gives the same trace as on `SimClock`, give or take the microseconds the code itself takes.
    """

    def __init__(self, start_s: float = 0.0) -> None:
        self._origin = time.monotonic() - start_s

    def now(self) -> float:
        return time.monotonic() - self._origin

    def advance(self, seconds: float) -> None:
        self._origin -= seconds
