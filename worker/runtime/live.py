"""A turn's live sink: what the model and the tools say as the turn runs, written to the run's
live stream (worker/store/live.py), tagged with the turn and the attempt.

The answer's words are batched: written when `flush_chars` wait, or `flush_ms` after the first
of them, by a timer, so a reader sees them within tens of ms while the store takes a few dozen
writes a second at most. A tool's start, end and progress go at once (after the words before
them). A turn's later attempt (a redelivery after a kill, or a retry of a cut stream) first
says the earlier attempt's text is abandoned. Nothing here raises into the turn: a store that
does not answer loses the live output, said once in the log; the commit is the truth.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import redis
import structlog

from turnstile.worker.settings import Settings
from turnstile.worker.store import live

log = structlog.get_logger("turnstile.live")


class StoreSink:
    """The live sink of one turn attempt of a run."""

    on = True

    def __init__(
        self, client: redis.Redis, settings: Settings, *, tenant: str, run_id: str, turn: int,
        attempt: int,
    ) -> None:  # fmt: skip
        self.client, self.tenant, self.run_id = client, tenant, run_id
        self.turn, self.attempt = turn, attempt
        self.maxlen = settings.live_max_entries
        self.ttl_s = int(settings.max_deadline_s + max(settings.retain_finished_s, 60.0))
        self.flush_s = settings.live_flush_ms / 1000
        self.flush_chars = settings.live_flush_chars
        self._lock = threading.Lock()  # the buffer and the timer
        self._io = threading.Lock()  # one write at a time, in the order said
        self._buffer: list[str] = []
        self._buffered = 0
        self._timer: threading.Timer | None = None
        self._said_text = False
        self._broken = False
        if attempt > 1:  # the turn's earlier attempt did not commit: its words are not the turn's
            why = "an earlier attempt of the turn did not commit"
            self._write([self._tag("abandoned", attempt=attempt - 1, reason=why)])

    def _tag(self, kind: str, **more: Any) -> dict[str, Any]:
        return {"type": kind, "turn": self.turn, "attempt": self.attempt, **more}

    def _write(self, entries: list[dict[str, Any]]) -> None:
        if self._broken or not entries:
            return
        with self._io:
            try:
                live.append(self.client, self.tenant, self.run_id, entries, maxlen=self.maxlen,
                            ttl_s=self.ttl_s)  # fmt: skip
            except redis.RedisError as exc:
                self._broken = True  # this turn's live output stops; its commit will tell
                log.warning("live_output_lost", run_id=self.run_id, turn=self.turn,
                            error=str(exc)[:200])  # fmt: skip

    def _take(self) -> list[dict[str, Any]]:
        """The words waiting, as one entry (none when none wait); the timer is cleared."""
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            if not self._buffer:
                return []
            words = "".join(self._buffer)
            self._buffer, self._buffered = [], 0
        self._said_text = True
        return [self._tag("text", text=words)]

    def flush(self) -> None:
        """Write the words waiting now."""
        self._write(self._take())

    # -- the LiveSink protocol (jobs/live.py) ----------------------------------------------

    def text(self, delta: str) -> None:
        if not delta:
            return
        with self._lock:
            self._buffer.append(delta)
            self._buffered += len(delta)
            full = self._buffered >= self.flush_chars
            if not full and self._timer is None:
                self._timer = threading.Timer(self.flush_s, self.flush)
                self._timer.daemon = True
                self._timer.start()
        if full:
            self.flush()

    def _now(self, kind: str, **more: Any) -> None:
        self._write([*self._take(), self._tag(kind, **more)])

    def tool_started(self, call: str, tool: str) -> None:
        self._now("tool_started", call=call, tool=tool)

    def tool_ended(self, call: str, tool: str, status: str) -> None:
        self._now("tool_ended", call=call, tool=tool, status=status)

    def progress(self, call: str, tool: str, note: str) -> None:
        self._now("progress", call=call, tool=tool, note=note, at_ms=int(time.time() * 1000))

    def abandon(self, reason: str) -> None:
        self._take()  # words never written need no abandoning
        if self._said_text:
            self._said_text = False
            self._write([self._tag("abandoned", reason=reason[:300])])

    def close(self) -> None:
        """The turn is over: its last words are written before its commit is."""
        self.flush()
