"""A webhook endpoint's circuit breaker, pure: no store, no clock of its own.

Closed, the endpoint gets its deliveries as they fall due. After `failures_to_open` failed
attempts in a row (a timeout, a refused connection, a 5xx: whatever does not deliver) it is
open for `cooldown_ms`: the deliverer starts nothing for it, and its deliveries wait in its
outbox (deferred, never dropped: each is still given up only by the retry rule). Then it is
half-open: one delivery goes as a trial; its success closes the breaker, its failure opens it
for another cool-down. Any success closes it, since the endpoint answered.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Circuit(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


@dataclass
class Breaker:
    failures_to_open: int
    cooldown_ms: int
    failures: int = 0  # failed attempts in a row
    open_until_ms: int = 0
    trial: bool = False  # the half-open trial is in flight

    def state(self, now_ms: int) -> Circuit:
        if self.failures < self.failures_to_open:
            return Circuit.CLOSED
        if self.trial or now_ms < self.open_until_ms:
            return Circuit.OPEN
        return Circuit.HALF_OPEN

    def allowed(self, now_ms: int) -> int | None:
        """How many deliveries may start now: any (None), none (0), or the one trial (1)."""
        state = self.state(now_ms)
        return None if state is Circuit.CLOSED else 1 if state is Circuit.HALF_OPEN else 0

    def started(self, now_ms: int) -> bool:
        """A delivery starts: whether it is the half-open trial (then it is marked)."""
        if self.state(now_ms) is not Circuit.HALF_OPEN:
            return False
        self.trial = True
        return True

    def finished(self, *, ok: bool, now_ms: int, trial: bool) -> Circuit:
        """Record an attempt's outcome; the state after it."""
        if trial:
            self.trial = False
        if ok:
            self.failures = 0
            return Circuit.CLOSED
        self.failures += 1
        if self.failures >= self.failures_to_open:
            self.open_until_ms = now_ms + self.cooldown_ms
        return self.state(now_ms)

    def abandoned(self) -> None:
        """The trial ended without an attempt (its delivery was gone): the next may try."""
        self.trial = False
