"""What a starting worker waits for (worker/runtime/reach.py): the store and the broker, looked
at until its start wait has passed on the clock it is given, then one line."""

from __future__ import annotations

from turnstile.worker.dev.embedded import free_port
from turnstile.worker.runtime.reach import POLL_S, Unreached, wait_reachable
from turnstile.worker.settings import Settings


class Clock:
    """A clock that moves only when slept on."""

    def __init__(self) -> None:
        self.now_s = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now_s

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now_s += seconds


def test_a_store_that_never_answers_is_looked_at_until_the_wait_has_passed() -> None:
    """With no server on the port, the store is asked every POLL_S until start_wait_s has
    passed, then one line names it (password hidden) and says what to do; exit status 1."""
    port = free_port()
    config = Settings(redis_url=f"redis://:pw@127.0.0.1:{port}/0", start_wait_s=5)
    clock = Clock()
    found = wait_reachable(config, sleep=clock.sleep, clock=clock)
    assert isinstance(found, Unreached) and found.exit_code == 1
    assert sum(clock.slept) == 5 and max(clock.slept) <= POLL_S
    line = found.line(config.start_wait_s)
    assert line.startswith(
        f"the store at redis://:***@127.0.0.1:{port}/0 did not answer within 5 s"
    )
    assert "Connection refused" in line and "turnstile dev-server" in line and ":pw@" not in line


def test_a_wait_of_zero_looks_once() -> None:
    """TURNSTILE_START_WAIT_S=0: one look, no sleep."""
    clock = Clock()
    config = Settings(redis_url=f"redis://127.0.0.1:{free_port()}/0", start_wait_s=0)
    assert wait_reachable(config, sleep=clock.sleep, clock=clock) is not None
    assert clock.slept == []
