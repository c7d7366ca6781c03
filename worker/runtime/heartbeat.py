"""The heartbeat: one thread per worker process renewing the in-flight lease of every turn it
runs, so the sweeper leaves them alone."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import structlog

log = structlog.get_logger("turnstile.step")


class Heartbeat:
    """Renews the in-flight lease of every turn the process is running, so the sweeper leaves
    them alone: one per turn on a green worker's hundreds, one on a prefork process. One
    thread (a greenlet on a green worker), started on first use, serves them all."""

    def __init__(self, every_s: float) -> None:
        self._every_s = every_s
        self._renewals: dict[int, Callable[[], None]] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    @contextmanager
    def beating(self, renew: Callable[[], None]) -> Iterator[None]:
        with self._lock:
            token = id(renew)
            self._renewals[token] = renew
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._loop, name="turnstile-heartbeat", daemon=True
                )
                self._thread.start()
        try:
            yield
        finally:
            with self._lock:
                self._renewals.pop(token, None)

    def _loop(self) -> None:
        while True:
            time.sleep(self._every_s)
            with self._lock:
                renewals = list(self._renewals.values())
            for renew in renewals:
                try:
                    renew()
                except Exception as exc:  # a missed heartbeat only risks a harmless duplicate
                    log.warning("heartbeat_failed", error=str(exc))
