"""What an acknowledged write has reached before Turnstile acknowledges it.

With `appendfsync everysec` a server acknowledges a write that is in its memory and, a second
later at most, on its disk: a crash of its machine in that second loses the write, though the
caller was told it happened. `TURNSTILE_DURABILITY` closes that window for the writes a caller
or an observer is told about (a submission, a decision, a step's commit) by sending, on the
same connection and in the same round trip as the write, a command that blocks until the
write is where the setting says:

- `none`: in the server's memory (the server's own fsync policy decides the rest);
- `aof`: in the server's append-only file, fsynced (`WAITAOF 1 0 timeout`); the server must
  run with `appendonly yes`, or every write is refused with a clear error;
- `replica`: in the memory of `TURNSTILE_DURABILITY_REPLICAS` replicas (`WAIT n timeout`),
  so a failover to one of them keeps it.

A wait that times out is an error the caller sees (`worker.store.NotDurableError`), never
silence: the write may or may not survive a crash, and the caller may retry (every such write
is idempotent or refused the second time).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class Durability(StrEnum):
    NONE = "none"
    AOF = "aof"
    REPLICA = "replica"


@dataclass(frozen=True)
class WaitFor:
    """The wait that follows each acknowledged write; `none` sends nothing."""

    mode: Durability = Durability.NONE
    replicas: int = 1
    timeout_s: float = 2.0

    @property
    def waits(self) -> bool:
        return self.mode is not Durability.NONE

    def command(self) -> list[Any]:
        """The command to send right after the write, on the same connection."""
        timeout_ms = max(1, round(self.timeout_s * 1000))
        if self.mode is Durability.AOF:
            return ["WAITAOF", 1, 0, timeout_ms]
        return ["WAIT", self.replicas, timeout_ms]

    def shortfall(self, reply: Any, what: str) -> str | None:
        """What the wait's reply says is missing, as a message that starts with `what` (e.g.
        "the change to run R was written but"); None when the write is where the setting
        wants it."""
        if self.mode is Durability.AOF:
            local = int(reply[0]) if isinstance(reply, list | tuple) and reply else 0
            if local < 1:
                return (
                    f"{what} not confirmed on the server's disk within "
                    f"{self.timeout_s:g} s (TURNSTILE_DURABILITY=aof); it may be lost if the "
                    "server fails now"
                )
        elif self.mode is Durability.REPLICA and int(reply) < self.replicas:
            return (
                f"{what} confirmed by {int(reply)} of {self.replicas} replica(s) "
                f"within {self.timeout_s:g} s (TURNSTILE_DURABILITY=replica); it may be lost "
                "if the server fails now"
            )
        return None
