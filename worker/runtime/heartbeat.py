"""The heartbeat: one thread per worker process renewing the in-flight lease of every turn it
runs, so the sweeper leaves them alone."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Generic, TypeVar

import structlog

log = structlog.get_logger("turnstile.step")

T = TypeVar("T")


class Heartbeat(Generic[T]):
    """Renews the in-flight lease of every turn the process is running, so the sweeper leaves
    them alone: one per turn on a green worker's hundreds, one on a prefork process. One
    thread (a greenlet on a green worker), started on first use, serves them all, renewing
    every turn it beats for in one call of `renew_all` (the store's: one round trip)."""

    def __init__(self, every_s: float, renew_all: Callable[[Sequence[T]], object]) -> None:
        self._every_s = every_s
        self._renew_all = renew_all
        self._turns: dict[int, T] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    @contextmanager
    def beating(self, turn: T) -> Iterator[None]:
        """`turn`'s lease renewed on every beat while the block runs."""
        token = object()
        with self._lock:
            self._turns[id(token)] = turn
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._loop, name="turnstile-heartbeat", daemon=True
                )
                self._thread.start()
        try:
            yield
        finally:
            with self._lock:
                self._turns.pop(id(token), None)

    def _loop(self) -> None:
        while True:
            time.sleep(self._every_s)
            with self._lock:
                turns = list(self._turns.values())
            if not turns:
                continue
            try:
                self._renew_all(turns)
            except Exception as exc:  # a missed heartbeat only risks a harmless duplicate
                log.warning("heartbeat_failed", turns=len(turns), error=str(exc))
