"""What a turn is given (`Runtime`: its job, model, clock and trace, the ledger gate for a
larger batch, the tool-call threads), and the arithmetic of the active time it spends."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from turnstile.jobs.calls import Gate, Unlimited
from turnstile.jobs.clock import Clock
from turnstile.jobs.job import Job
from turnstile.jobs.live import NO_LIVE, LiveSink
from turnstile.jobs.model import Model
from turnstile.jobs.state import RunState
from turnstile.jobs.trace import Trace

READ_POOL_SIZE = 8  # concurrent reads in one turn, and so each process's tool-call threads


@dataclass
class Runtime:
    """What a turn is given: the kernel owns none of it."""

    job: Job
    model: Model
    clock: Clock
    trace: Trace
    gate: Gate = field(default_factory=Unlimited)
    pool: ThreadPoolExecutor | None = None  # a process can share one across turns
    live: LiveSink = NO_LIVE  # where the turn's live output goes (jobs/live.py)
    # Log a tool's unexpected exception with its traceback (once, where the run runs); a
    # replay, which re-runs the tools of a run that ran, says nothing more.
    log_tool_raises: bool = True
    # A replay: how long each tool call took where the run ran (by span id), charged instead
    # of what the replay measures, which a worker's wall clock cannot give twice.
    recorded_s: Callable[[str], float | None] | None = None
    _own_pool: ThreadPoolExecutor | None = field(default=None, init=False, repr=False)

    @property
    def executor(self) -> ThreadPoolExecutor:
        if self.pool is not None:
            return self.pool
        if self._own_pool is None:
            self._own_pool = ThreadPoolExecutor(READ_POOL_SIZE, "turnstile-tool")
        return self._own_pool

    def close(self) -> None:
        """Shut down the pool this runtime made for itself; a shared one is left alone."""
        if self._own_pool is not None:
            self._own_pool.shutdown(wait=False, cancel_futures=True)


def ms(seconds: float) -> int:
    return max(0, round(seconds * 1000))


def remaining_ms(state: RunState) -> int:
    return max(0, state.budget.deadline_ms - state.usage.elapsed_ms)


def spend_time(state: RunState, clock: Clock, latency_ms: int, measured_s: float) -> None:
    """Charge active time, and move the clock by whatever was reported but not lived."""
    state.usage.elapsed_ms += latency_ms
    lag = latency_ms / 1000 - measured_s
    if lag > 0:
        clock.advance(lag)
