"""The job versions each live worker serves, with a heartbeat.

Keys: `keys.JOB_VERSIONS`, one sorted set whose members are "<job>|<version>|<fingerprint>|
<worker>" scored by the store's time (ms) at which the worker's claim lapses unless renewed.
A worker claims its jobs' versions as it starts (`claim`), renews them on a heartbeat
(`renew`) and gives them up as it stops (`release`); one killed lapses within its TTL. A claim
of a version that a live worker serves under another fingerprint (another definition under the
same declared version) is refused, naming that worker; the check is made before the claim
and again after it, so two workers starting together cannot both pass it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, cast

import redis

from turnstile.worker.store import keys
from turnstile.worker.store.values import server_ms, text

# How a parked run's reason begins when it waits for a worker of its job's version: the
# requeuer (scheduling/versions.py) takes these parked runs back, and no others.
WAITING_FOR_VERSION = "waiting for a worker of version"


@dataclass(frozen=True)
class Served:
    """One job version a worker serves: its fingerprint, and when its claim lapses (ms)."""

    job: str
    version: str
    fingerprint: str
    worker: str
    until_ms: int

    @property
    def member(self) -> str:
        return member(self.job, self.version, self.fingerprint, self.worker)


def member(job: str, version: str, fingerprint: str, worker: str) -> str:
    return f"{job}|{version}|{fingerprint}|{worker}"


def _parse(raw: object, score: float) -> Served | None:
    parts = text(raw).split("|", 3)
    if len(parts) != 4:
        return None
    return Served(parts[0], parts[1], parts[2], parts[3], int(score))


def live(client: redis.Redis, now_ms: int | None = None) -> list[Served]:
    """Every claim whose heartbeat has not lapsed, by job, version and worker."""
    now = server_ms(client) if now_ms is None else now_ms
    rows: list[tuple[object, float]] = cast(
        Any, client.zrangebyscore(keys.JOB_VERSIONS, now, "+inf", withscores=True)
    )
    found = [s for s in (_parse(m, score) for m, score in rows) if s is not None]
    return sorted(found, key=lambda s: (s.job, s.version, s.worker))


def conflicts(
    claims: Iterable[tuple[str, str, str]], served: Iterable[Served], worker: str
) -> str | None:
    """The one line refusing a claim (job, version, fingerprint) that another live worker
    serves under another fingerprint, or None."""
    held = {(s.job, s.version): s for s in served if s.worker != worker}
    for job, version, print_ in claims:
        other = held.get((job, version))
        if other is not None and other.fingerprint != print_:
            return (
                f"job {job!r} version {version!r} is served by worker {other.worker} with "
                "another definition (its tools, params or state differ): give this one "
                "another version"
            )
    return None


def claim(
    client: redis.Redis, worker: str, claims: list[tuple[str, str, str]], ttl_ms: int
) -> str | None:
    """Claim (job, version, fingerprint) for `worker` until now + ttl; the refusal's line when
    a live worker serves one of them under another fingerprint (its own claims are taken back
    then). Checked before the claim and again after it, so of two workers starting together
    with different definitions neither serves alongside the other (both may be refused: each
    starts again to find the other's claim, or none). Plain commands, no WATCH: a cluster's
    client runs them too."""
    now = server_ms(client)
    refusal = conflicts(claims, live(client, now), worker)
    if refusal is not None or not claims:
        return refusal
    pipe = client.pipeline(transaction=False)
    pipe.zremrangebyscore(keys.JOB_VERSIONS, "-inf", now - ttl_ms)  # long gone
    pipe.zadd(keys.JOB_VERSIONS, {member(j, v, f, worker): now + ttl_ms for j, v, f in claims})
    pipe.execute()
    refusal = conflicts(claims, live(client), worker)
    if refusal is not None:
        release(client, worker, claims)
    return refusal


def renew(
    client: redis.Redis, worker: str, claims: list[tuple[str, str, str]], ttl_ms: int
) -> None:
    """The heartbeat: the worker's claims pushed to now + ttl."""
    if claims:
        until = server_ms(client) + ttl_ms
        client.zadd(keys.JOB_VERSIONS, {member(j, v, f, worker): until for j, v, f in claims})


def release(client: redis.Redis, worker: str, claims: list[tuple[str, str, str]]) -> None:
    """The worker stops: its claims go at once (a killed one's lapse with its TTL)."""
    if claims:
        client.zrem(keys.JOB_VERSIONS, *(member(j, v, f, worker) for j, v, f in claims))


def serving(client: redis.Redis, job: str, version: str, now_ms: int | None = None) -> list[str]:
    """The live workers serving that version of that job."""
    return [s.worker for s in live(client, now_ms) if s.job == job and s.version == version]


def mark_waiting(client: redis.Redis, tenant: str, run_id: str) -> None:
    """A run just parked for a worker of its version: the heartbeats look at it first."""
    client.sadd(keys.VERSION_WAITING, f"{tenant}|{run_id}")


def unmark_waiting(client: redis.Redis, tenant: str, run_id: str) -> None:
    client.srem(keys.VERSION_WAITING, f"{tenant}|{run_id}")


def marked_waiting(client: redis.Redis) -> list[tuple[str, str]]:
    """(tenant, run id) of the runs marked waiting for a version (some may have moved on)."""
    pairs = (text(m).partition("|") for m in client.smembers(keys.VERSION_WAITING))
    return sorted((t, r) for t, _, r in pairs if t and r)
