"""A turn's live sink: what the model and the tools say as the turn runs, written to the run's
live stream (worker/store/live.py), tagged with the turn and the attempt.

Everything is batched: written when `flush_chars` of the answer's words wait, or `flush_ms`
after the first entry waiting, by a timer, or when the turn ends, so a reader sees it within
tens of ms while the store takes a few dozen writes a second at most, and neither the model's
stream nor a tool's thread ever waits on the store. A turn's later attempt (a redelivery
after a kill) first says the earlier attempt's text is abandoned; so does a retry of a cut
stream, or a model call that failed. Nothing here raises into the turn: a store that
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
        self._lock = threading.Lock()  # the entries waiting and the timer
        self._io = threading.Lock()  # one write at a time, in the order said
        self._waiting: list[dict[str, Any]] = []
        self._chars = 0  # of words waiting
        self._timer: threading.Timer | None = None
        self._said_text = False  # words of this attempt were written
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

    def _add(self, entry: dict[str, Any] | None, words: str = "") -> bool:
        """Queue an entry (or words, joined to the words waiting last); start the timer that
        writes them if none runs. Whether enough words wait to write them now."""
        with self._lock:
            last = self._waiting[-1] if self._waiting else None
            if entry is not None:
                self._waiting.append(entry)
            elif last is not None and last["type"] == "text":
                last["text"] += words
            else:
                self._waiting.append(self._tag("text", text=words))
            self._chars += len(words)
            full = self._chars >= self.flush_chars
            if not full and self._timer is None:
                self._timer = threading.Timer(self.flush_s, self.flush)
                self._timer.daemon = True
                self._timer.start()
        return full

    def _take(self) -> list[dict[str, Any]]:
        """The entries waiting (the timer cleared)."""
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            taken, self._waiting, self._chars = self._waiting, [], 0
        if any(e["type"] == "text" for e in taken):
            self._said_text = True
        return taken

    def flush(self) -> None:
        """Write what waits now, in one round trip."""
        self._write(self._take())

    # -- the LiveSink protocol (jobs/live.py) ----------------------------------------------
    # Each only queues what it is told, so a tool's thread or the model's stream never waits
    # on the store: the timer (or enough words, or the turn's end) writes it.

    def text(self, delta: str) -> None:
        if delta and self._add(None, delta):
            self.flush()

    def tool_started(self, call: str, tool: str) -> None:
        self._add(self._tag("tool_started", call=call, tool=tool))

    def tool_ended(self, call: str, tool: str, status: str) -> None:
        self._add(self._tag("tool_ended", call=call, tool=tool, status=status))

    def progress(self, call: str, tool: str, note: str) -> None:
        at_ms = int(time.time() * 1000)
        self._add(self._tag("progress", call=call, tool=tool, note=note, at_ms=at_ms))

    def abandon(self, reason: str) -> None:
        """Words not yet written are dropped; words written are followed by `abandoned`."""
        with self._lock:
            self._waiting = [e for e in self._waiting if e["type"] != "text"]
            self._chars = 0
            if self._said_text:
                self._said_text = False
                self._waiting.append(self._tag("abandoned", reason=reason[:300]))
        self.flush()

    def close(self) -> None:
        """The turn is over: its last words are written before its commit is."""
        self.flush()
