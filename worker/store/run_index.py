"""Runs as other packages read them outside a step: their hashes' fields (fields.py), the
tenant's indexes (runs by creation time, by status, by outcome), the run-tenants map that
finds a run by its id alone, and the removal of old runs (run_expire.lua). The run store
(runs.py) writes them; a step reads them through its scripts.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import redis
from redis.commands.core import Script

from turnstile.worker.store import fields, keys
from turnstile.worker.store.run_calls import expire_call
from turnstile.worker.store.scripts import evalsha, register, with_scripts
from turnstile.worker.store.values import text, writing

SCAN_COUNT = 500  # members asked for per SSCAN call: indexes are read in slices
Run = tuple[str, str]  # (tenant, run id)


# -- one run, or a few --------------------------------------------------------------------


def exists(client: redis.Redis, tenant: str, run_id: str) -> bool:
    return bool(client.exists(keys.run(tenant, run_id)))


def tenant_of(client: redis.Redis, run_id: str) -> str | None:
    """The tenant of the run with this id (the run-tenants map), None when none is known."""
    tenant = client.hget(keys.RUN_TENANTS, run_id)
    return str(tenant) if tenant else None


def fields_of(client: redis.Redis, tenant: str, run_id: str, *names: str) -> list[Any]:
    """The run's fields `names`, as stored (None for one not there)."""
    return list(client.hmget(keys.run(tenant, run_id), *names))


def fields_of_runs(client: redis.Redis, runs: Sequence[Run], *names: str) -> list[list[Any]]:
    """`fields_of` for each run, in one round trip."""
    pipe = client.pipeline(transaction=False)
    for tenant, run_id in runs:
        pipe.hmget(keys.run(tenant, run_id), *names)
    return [list(found) for found in pipe.execute()]


def hashes(client: redis.Redis, runs: Sequence[Run]) -> list[dict[str, str]]:
    """Each run's whole hash as text ({} for a run that is gone), in one round trip."""
    pipe = client.pipeline(transaction=False)
    for tenant, run_id in runs:
        pipe.hgetall(keys.run(tenant, run_id))
    return [{text(k): text(v) for k, v in raw.items()} for raw in pipe.execute()]


def mark_resent(
    client: redis.Redis, tenant: str, run_id: str, version: str, now_ms: int, *,
    pipe: Any | None = None,
) -> None:  # fmt: skip
    """Note that the sweeper sent step `version` again at `now_ms` (fields.RESENT)."""
    with writing(client, pipe) as out:
        out.hset(keys.run(tenant, run_id), fields.RESENT, f"{version}|{now_ms}")


# -- a tenant's indexes -------------------------------------------------------------------


def in_status(client: redis.Redis, tenant: str, status: str) -> Iterator[list[str]]:
    """The ids of the tenant's runs in `status`, a slice of about SCAN_COUNT at a time (SSCAN:
    a run present throughout is seen, maybe twice)."""
    yield from _scan(client, keys.by_status(tenant, status))


def _scan(client: redis.Redis, key: str) -> Iterator[list[str]]:
    cursor = 0
    while True:
        cursor, members = client.sscan(key, cursor, count=SCAN_COUNT)
        if members:
            yield [text(m) for m in members]
        if int(cursor) == 0:
            return


def created_before(
    client: redis.Redis, tenant: str, cutoff_ms: int, *, skip: int, most: int
) -> list[str]:
    """Ids of the tenant's runs created by `cutoff_ms`, oldest first, past the first `skip`."""
    return [text(r) for r in client.zrangebyscore(keys.runs(tenant), "-inf", cutoff_ms,
                                                  start=skip, num=most)]  # fmt: skip


# -- a tenant's runs matching a filter, newest first ------------------------------------------

Bound = tuple[int, str]  # (created ms, run id) within one tenant: entries below it come next


@dataclass
class Matching:
    """Runs of one tenant that match a filter, newest first."""

    entries: list[Bound]  # at most the number asked for
    stopped_at: Bound | None = None  # a walk that ran out of budget: nothing below is known


def matching(
    client: redis.Redis, tenant: str, *, status: str | None, outcome: str | None,
    below: Bound | None, want: int, small_index: int, chunk: int, budget: int,
) -> Matching:  # fmt: skip
    """Up to `want` of the tenant's runs below `below` in `status` and with `outcome` (either
    None: any), newest first. A filter whose smallest index has at most `small_index` runs (the
    live ones: parked, suspended, running) is read whole in slices and ordered by creation;
    a bigger one (stopped runs, an outcome) is checked against the tenant's runs index walked
    newest first, `chunk` runs a round trip and at most `budget` runs, after which the walk
    stops and says where."""
    sets = [keys.by_status(tenant, status)] if status else []
    sets += [keys.by_outcome(tenant, outcome)] if outcome else []
    if sets and min(int(client.scard(k)) for k in sets) <= small_index:
        return _small(client, tenant, sets, below, want)
    return _walk(client, tenant, sets, below, want, chunk=chunk, budget=budget)


def _newest(client: redis.Redis, tenant: str, below: Bound | None, n: int) -> list[Bound]:
    """Up to n of the tenant's runs below `below`, newest first, from its runs index."""
    key = keys.runs(tenant)
    if below is None:
        raw: list[Any] = client.zrevrangebyscore(
            key, "+inf", "-inf", start=0, num=n, withscores=True
        )
        return [(int(score), text(m)) for m, score in raw]
    ms, run_id = below
    ties = sorted((text(m) for m in client.zrangebyscore(key, ms, ms)), reverse=True)
    older: list[Any] = client.zrevrangebyscore(
        key, f"({ms}", "-inf", start=0, num=n, withscores=True
    )
    out = [(ms, m) for m in ties if m < run_id] + [(int(sc), text(m)) for m, sc in older]
    return out[:n]


def _members(client: redis.Redis, sets: list[str], ids: list[str]) -> list[bool]:
    """Whether each id is in every one of `sets`."""
    keep = [True] * len(ids)
    for key in sets:
        flags = client.smismember(key, ids) if ids else []
        keep = [k and bool(f) for k, f in zip(keep, flags, strict=True)]
    return keep


def _walk(
    client: redis.Redis, tenant: str, sets: list[str], below: Bound | None, want: int, *,
    chunk: int, budget: int,
) -> Matching:  # fmt: skip
    found = Matching([])
    examined = 0
    while examined < budget:
        some = _newest(client, tenant, below, chunk)
        if not some:
            return found
        keep = _members(client, sets, [r for _, r in some])
        for entry, matches in zip(some, keep, strict=True):
            below = entry
            if matches:
                found.entries.append(entry)
                if len(found.entries) == want:
                    return found
        examined += len(some)
    found.stopped_at = below
    return found


def _small(
    client: redis.Redis, tenant: str, sets: list[str], below: Bound | None, want: int
) -> Matching:
    """Read the smallest filter index whole (in slices) and order it by creation."""
    smallest, *others = sorted(sets, key=lambda k: int(client.scard(k)))
    ids = sorted({run_id for part in _scan(client, smallest) for run_id in part})
    ids = [r for r, k in zip(ids, _members(client, others, ids), strict=True) if k]
    scores = client.zmscore(keys.runs(tenant), ids) if ids else []
    entries = sorted(
        ((int(score), run_id) for run_id, score in zip(ids, scores, strict=True)
         if score is not None),
        reverse=True,
    )  # fmt: skip
    return Matching([e for e in entries if below is None or e < below][:want])


# -- removing old runs ----------------------------------------------------------------------


def expirer(client: redis.Redis) -> Script:
    """run_expire.lua, registered (no I/O)."""
    return register(client, "run_expire")


def expire(
    client: redis.Redis, expire_script: Script, tenant: str, due: Sequence[tuple[str, str]],
    cutoff_ms: int,
) -> int:  # fmt: skip
    """Remove each (run id, outcome) of `due` that is stopped and ended by `cutoff_ms` (or
    that has no run behind it), with everything that names it; how many went."""
    if not due:
        return 0

    def build(pipe: Any) -> None:
        for run_id, outcome in due:
            call = expire_call(tenant, run_id, outcome=outcome, cutoff_ms=cutoff_ms)
            evalsha(pipe, expire_script, call.keys, call.args)

    replies = with_scripts(client, (expire_script,), build)
    gone = [run_id for (run_id, _), ok in zip(due, replies, strict=True) if ok]
    # The run-tenants map last: a crash before it leaves an entry that finds no run (a
    # lookup says "no run"), never a run that cannot be found. Only this tenant's entries.
    if gone:
        pipe = client.pipeline(transaction=False)
        for run_id in gone:
            pipe.hget(keys.RUN_TENANTS, run_id)
        owners = pipe.execute()
        mine = [r for r, owner in zip(gone, owners, strict=True) if text(owner) == tenant]
        if mine:
            client.hdel(keys.RUN_TENANTS, *mine)
    return len(gone)
