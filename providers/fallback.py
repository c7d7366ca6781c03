"""A run's second model, asked when the first keeps failing in a way a retry could fix.

The first model is asked as usual, its retries bounded by the turn's time. When it gives up
with `ModelUnavailable` (rate limits, 5xx, no connection, past its attempts or a wait past the
deadline), the fallback is asked, within the time that is left. Any other stop of the first
model (a rejected key, a refusal) ends the run as it would without a fallback: a second model
is no answer to a request that cannot succeed. Each turn starts with the first model again.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

import structlog

from turnstile.jobs.model import Model, ModelRequest, ModelResponse, ModelUnavailable

log = structlog.get_logger("turnstile.models")


class Fallback:
    """The first model, and the second when the first is unavailable for the turn."""

    def __init__(
        self,
        first: Model,
        second: Model,
        *,
        first_spec: str,
        second_spec: str,
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        self.first, self.second = first, second
        self.first_spec, self.second_spec, self.now = first_spec, second_spec, now

    def next(self, request: ModelRequest) -> ModelResponse:
        t0 = self.now()
        try:
            return self.first.next(request)
        except ModelUnavailable as unavailable:
            left_s = request.timeout_s - (self.now() - t0)
            if left_s <= 0:
                raise
            why = f"{self.first_spec}: {unavailable.reason}"[:300]
            log.warning(
                "model_fallback", model=self.first_spec, fallback=self.second_spec, reason=why
            )
            response = self.second.next(replace(request, timeout_s=left_s))
        return replace(response, answered_by=response.answered_by or self.second_spec, fallback=why)
