"""Eager continuation: a commit that would queue its run's next step may claim it for this
worker instead (run_commit.lua checks that fair share would pick this run anyway), and the
same task runs it at once (worker/runtime/task.py loops over `Step.following`). A claimed turn
must fit in the delivery's hard time limit, which Celery enforces on every turn it runs."""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass

from turnstile.worker.broker.message import StepMessage
from turnstile.worker.observability import metrics
from turnstile.worker.runtime.services import Services
from turnstile.worker.store.runs import Claim, Loaded

# A claimed turn's own hard limit may end this much after the delivery's (whose limits Celery
# enforces): the delivery's soft limit then fires at most this much before the turn's would.
EAGER_SLACK_S = 1.0


@dataclass(frozen=True)
class Chain:
    """A delivery's chain of turns: the first, which the message brought, then each one a
    commit claimed."""

    delivery: str = "-"  # the message: its task id and retry count
    eager: int = 0  # how many more turns of the run this delivery may claim
    deadline: float | None = None  # when its hard time limit ends (monotonic; None: none)
    at: int = 0  # this turn's place in the chain (its delivery token says "+n")
    committed_at: float = 0.0  # when the commit that claimed this turn returned (monotonic)

    def claim(
        self, services: Services, following: StepMessage, hard_s: float
    ) -> tuple[Claim | None, str]:
        """What the commit needs to claim the run's next step, whose hard limit is `hard_s`,
        and the claimed delivery's token ("+n" its place in the chain); None when the chain may
        claim no more, or the turn would not fit in the delivery."""
        if self.eager <= 0:
            return None, ""
        slack_s = min(EAGER_SLACK_S, services.settings.soft_margin_s / 2)
        if self.deadline is not None and time.monotonic() + hard_s > self.deadline + slack_s:
            return None, ""
        token = f"{self.delivery}+{self.at + 1}.{secrets.token_hex(4)}"
        return services.claim(following, hard_s, token), token

    def then(self) -> Chain:
        """The chain as the turn a commit just claimed carries it."""
        return Chain(self.delivery, self.eager - 1, self.deadline, self.at + 1, time.monotonic())

    def gap(self, loaded: Loaded, claimed: bool) -> None:
        """The time from the commit before to this turn's start, for the metrics."""
        if claimed:
            metrics.turn_gap(time.monotonic() - self.committed_at, eager=True)
        else:
            metrics.turn_gap(loaded.gap_ms / 1000, eager=False)
