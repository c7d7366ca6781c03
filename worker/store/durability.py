"""What an acknowledged write has reached before Turnstile acknowledges it.

`TURNSTILE_DURABILITY` closes the window between a server's reply and its disk for the writes
a caller or an observer is told about (a submission, a decision, a step's commit) with
commands sent on the same connection and in the same round trip as the write:

- `none`: in the server's memory (the server's own fsync policy decides the rest);
- `aof`: in the server's append-only file, fsynced, on a server that runs `appendonly yes`
  with `appendfsync always`;
- `replica`: in the memory of `TURNSTILE_DURABILITY_REPLICAS` replicas (`WAIT n timeout`
  after the write), so a failover to one of them keeps it.

`aof` rests on what `appendfsync always` does: the server writes and fsyncs its append-only
file once per pass of its event loop, for every write of the pass, before it sends any reply
of the pass (Valkey's and Redis's `beforeSleep`: the AOF is flushed "before
handleClientsWithPendingWrites, in case of appendfsync=always"; a failed write or fsync stops
the server). So the write's own reply already comes after its fsync, and what is left to
prove is that the server runs that way now. The round trip is `WAITAOF 1 0 timeout`, the
write, `CONFIG GET appendfsync`: the WAITAOF, first, answers at once when the server's AOF is
on and keeps its fsynced offset (it is refused with AOF off, and blocks until its timeout
while the AOF waits for its first rewrite after being switched on); the policy, read after
the write, is the one the write's pass ran under. A WAITAOF after the write would wait for
it too, but it is answered only on the server's next pass: each commit then waits for two
passes (and their fsyncs) instead of one, which halved a green worker's durable turns/s
(0.50x of `none`, against 0.83x for `appendfsync always` alone).

`aof` holds only under `appendfsync always`. Under `everysec` the Valkey this project ships and
tests (8.1) answers WAITAOF before the fsync when less than a second has passed since the last
one (the bug Redis PR #13793 fixes; no Valkey release is known to carry the fix), and replies
before the fsync; under `no` the server never fsyncs. So `check_server` refuses both at a
worker's and a client's start, in one line naming the setting to change, and every write
reads `appendfsync` again in its own round trip: a server reconfigured, or a failover to one
configured otherwise, is refused at the first write instead of trusted.

WAIT has no such early answer: a replica acknowledges the offset it has applied to its memory
(not its disk), so `replica` survives a crash of the primary with a replica promoted, not a
power loss of the primary and its replicas together.

A wait that times out is an error the caller sees (`worker.store.NotDurableError`), never
silence: the write may or may not survive a crash, and the caller may retry (every such write
is idempotent or refused the second time).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import redis
from redis.commands.core import Script

from turnstile.errors import TurnstileError
from turnstile.worker.store.errors import NotDurableError, reached
from turnstile.worker.store.scripts import with_scripts
from turnstile.worker.store.values import text

# The one fsync policy under which a write's reply means the write is on the disk.
FSYNC_POLICY = "always"


class Durability(StrEnum):
    NONE = "none"
    AOF = "aof"
    REPLICA = "replica"


class DurabilityRefusedError(TurnstileError):
    """The server cannot keep the promise TURNSTILE_DURABILITY makes: one line naming the
    setting to change. Raised at a worker's or a client's start, before anything is written."""


def config_reply(reply: Any) -> dict[str, str]:
    """CONFIG GET's reply (a flat list of names and values, or a mapping) as a dict."""
    if isinstance(reply, Mapping):
        return {text(k): text(v) for k, v in reply.items()}
    items = [text(v) for v in reply or []]
    return dict(zip(items[::2], items[1::2], strict=True))


@dataclass(frozen=True)
class WaitFor:
    """The wait that follows each acknowledged write; `none` sends nothing."""

    mode: Durability = Durability.NONE
    replicas: int = 1
    timeout_s: float = 2.0

    @property
    def waits(self) -> bool:
        return self.mode is not Durability.NONE

    def commands(self) -> tuple[list[list[Any]], list[list[Any]]]:
        """The commands to send before the write and after it, on the same connection and in
        the same round trip. `aof`: WAITAOF first (answered at once only when the server's AOF
        is on and fsyncs as it goes: refused with AOF off, blocked while it waits for its first
        rewrite),
        the fsync policy after the write (the policy the write's pass ran under). `replica`:
        WAIT after the write, for the replicas to apply it."""
        timeout_ms = max(1, round(self.timeout_s * 1000))
        if self.mode is Durability.AOF:
            return [["WAITAOF", 1, 0, timeout_ms]], [["CONFIG", "GET", "appendfsync"]]
        return [], [["WAIT", self.replicas, timeout_ms]]

    def shortfall(self, replies: list[Any], what: str) -> str | None:
        """What the replies to `commands()` say is missing, as a message that starts with
        `what` (e.g. "the change to run R was written but"); None when the write is where
        the setting wants it."""
        if self.mode is Durability.AOF:
            waited, config = replies
            local = int(waited[0]) if isinstance(waited, list | tuple) and waited else 0
            if local < 1:
                return (
                    f"{what} not confirmed on the server's disk within "
                    f"{self.timeout_s:g} s (TURNSTILE_DURABILITY=aof); it may be lost if the "
                    "server fails now"
                )
            policy = config_reply(config).get("appendfsync", "unknown")
            if policy != FSYNC_POLICY:
                return (
                    f"{what} confirmed under the server's appendfsync {policy}, which may "
                    f"confirm before the fsync (TURNSTILE_DURABILITY=aof needs appendfsync "
                    f"{FSYNC_POLICY}); it may be lost if the server fails now"
                )
        elif self.mode is Durability.REPLICA and int(replies[0]) < self.replicas:
            return (
                f"{what} confirmed by {int(replies[0])} of {self.replicas} replica(s) "
                f"within {self.timeout_s:g} s (TURNSTILE_DURABILITY=replica); it may be lost "
                "if the server fails now"
            )
        return None


def written(
    client: redis.Redis, wait_for: WaitFor, build: Callable[[Any], None], what: str,
    scripts: Sequence[Script],
) -> list[Any]:  # fmt: skip
    """The pipeline `build` makes (calling `scripts` by their sha), with `wait_for`'s commands
    before and after it, on the same connection and in the same round trip. The pipeline's
    replies; raises NotDurableError when the wait times out, the server cannot wait, or
    (`aof`) its fsync policy cannot back the write's reply, and the first error among the
    writes' replies as it is."""
    before, after = wait_for.commands()

    def build_and_wait(pipe: Any) -> None:
        for command in before:
            pipe.execute_command(*command)
        build(pipe)
        for command in after:
            pipe.execute_command(*command)

    with reached():
        replies = with_scripts(client, scripts, build_and_wait, raise_on_error=False)
    waited = replies[: len(before)] + replies[len(replies) - len(after) :]
    done = replies[len(before) : len(replies) - len(after)]
    for reply in done:
        if isinstance(reply, Exception):
            raise reply
    for reply in waited:
        if isinstance(reply, Exception):
            raise NotDurableError(f"{what} cannot be confirmed: {reply}")
    shortfall = wait_for.shortfall(waited, what)
    if shortfall:
        raise NotDurableError(shortfall)
    return done


def _server(client: redis.Redis) -> str:
    """The server's name and version, for a refusal ("valkey 8.1.8")."""
    try:
        info: dict[str, Any] = client.info("server")
    except redis.ResponseError:
        return "the server"
    name = str(info.get("server_name") or "redis")
    return f"{name} {info.get(f'{name}_version') or info.get('redis_version', '?')}"


def aof_refusal(appendonly: str, policy: str, server: str = "the server") -> str | None:
    """Why `aof` cannot keep its promise on a server with these `appendonly` and
    `appendfsync` settings (one line naming the setting to change); None when it can.
    `server` names it ("valkey 8.1.8") in the everysec refusal."""
    if appendonly != "yes":
        return (
            f"TURNSTILE_DURABILITY=aof needs the server's appendonly yes (it is {appendonly}): "
            f"set appendonly yes and appendfsync {FSYNC_POLICY} on the server, or set "
            "TURNSTILE_DURABILITY=none"
        )
    if policy == FSYNC_POLICY:
        return None
    if policy == "everysec":
        why = f"under it {server} may confirm a write before its fsync, the bug Redis PR #13793"
        why += " fixes"
    elif policy == "no":
        why = "the server leaves fsync to the OS and confirms no write"
    else:
        why = "a policy Turnstile does not know"
    return (
        f"TURNSTILE_DURABILITY=aof needs the server's appendfsync {FSYNC_POLICY} (it is "
        f"{policy}: {why}): set appendfsync {FSYNC_POLICY} on the server"
    )


def _check_aof(client: redis.Redis) -> None:
    try:
        config = config_reply(client.config_get("appendonly", "appendfsync"))
    except redis.ResponseError as exc:  # renamed, disabled or denied to this user
        raise DurabilityRefusedError(
            f"TURNSTILE_DURABILITY=aof cannot check the server's appendfsync: CONFIG GET is "
            f"refused ({text(exc)}); allow it for this user (ACL +config|get) or set "
            "TURNSTILE_DURABILITY=none"
        ) from exc
    appendonly, policy = config.get("appendonly", "no"), config.get("appendfsync", "unknown")
    server = _server(client) if policy == "everysec" else "the server"
    refusal = aof_refusal(appendonly, policy, server)
    if refusal:
        raise DurabilityRefusedError(refusal)


def _check_replica(client: redis.Redis, replicas: int) -> None:
    try:
        info: dict[str, Any] = client.info("replication")
    except redis.ResponseError as exc:  # denied to this user
        raise DurabilityRefusedError(
            f"TURNSTILE_DURABILITY=replica cannot count the server's replicas: INFO is refused "
            f"({text(exc)}); allow it for this user (ACL +info) or set TURNSTILE_DURABILITY=none"
        ) from exc
    if info.get("role") != "master":
        raise DurabilityRefusedError(
            "TURNSTILE_DURABILITY=replica needs the primary, and the server is a replica: "
            "point TURNSTILE_REDIS_URL at the primary"
        )
    online = sum(
        1
        for key, value in info.items()
        if key.startswith("slave") and isinstance(value, dict) and value.get("state") == "online"
    )
    if online < replicas:
        raise DurabilityRefusedError(
            f"TURNSTILE_DURABILITY=replica needs {replicas} replica(s) following the server, "
            f"and {online} is: start one (replicaof <host> <port>), lower "
            "TURNSTILE_DURABILITY_REPLICAS, or set TURNSTILE_DURABILITY=none"
        )


def check_server(client: redis.Redis, wait_for: WaitFor) -> None:
    """At a worker's or a client's start: refuse, in one line naming the setting to change, a
    server under which `wait_for` cannot keep its promise (see the module's doc). A server
    that does not answer is not judged here: the caller finds it down at its first write, and
    every write checks again."""
    if not wait_for.waits:
        return
    try:
        if wait_for.mode is Durability.AOF:
            _check_aof(client)
        else:
            _check_replica(client, wait_for.replicas)
    except (redis.ConnectionError, redis.TimeoutError):
        return
