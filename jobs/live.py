"""A turn's live output: what a reader may watch while the turn runs, apart from its state.

The kernel hands a `LiveSink` to the model call (`ModelRequest.live`) and to each tool call
(`ToolContext.progress`). A model that streams says its answer's words as they come (`text`);
a tool says how far it got (`progress`); the kernel says when a tool call starts and ends.
When an attempt's output will not be the turn's (the provider's stream was cut and is asked
again, the model call failed), the model or the kernel says `abandon`: a reader drops the text
of the turn it was given before that. None of it is state: the committed turn is the truth,
and a sink that writes nowhere (`NO_LIVE`) changes nothing a turn does.

Pure: the worker's sink (worker/runtime/live.py) writes to the store; this module names what
any sink is told.
"""

from __future__ import annotations

from typing import Protocol


class LiveSink(Protocol):
    """Where a turn's live output goes. Every method returns at once and never raises into the
    turn: a sink that cannot write drops what it was told (the committed turn still tells)."""

    @property
    def on(self) -> bool:
        """Whether anyone may read what is said: a model streams only when it is on."""
        ...

    def text(self, delta: str) -> None:
        """More of the model's answer, in order: the deltas of one attempt join to its text."""
        ...

    def tool_started(self, call: str, tool: str) -> None:
        """Tool call `call` (its span id, e.g. t3.c1) of tool `tool` started."""
        ...

    def tool_ended(self, call: str, tool: str, status: str) -> None:
        """Tool call `call` ended: `status` is its observation's (ok, error, ...)."""
        ...

    def progress(self, call: str, tool: str, note: str) -> None:
        """A tool call's own note of how far it got (`ctx.progress("...")`)."""
        ...

    def abandon(self, reason: str) -> None:
        """The text said so far in this turn will not be the turn's: drop it."""
        ...


class NoLive:
    """The sink that writes nowhere: a replay, a test, a worker with live output off."""

    on = False

    def text(self, delta: str) -> None:
        return None

    def tool_started(self, call: str, tool: str) -> None:
        return None

    def tool_ended(self, call: str, tool: str, status: str) -> None:
        return None

    def progress(self, call: str, tool: str, note: str) -> None:
        return None

    def abandon(self, reason: str) -> None:
        return None


NO_LIVE: LiveSink = NoLive()

MAX_NOTE_CHARS = 500  # a progress note is a line, not a payload
