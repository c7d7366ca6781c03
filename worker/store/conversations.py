"""A submission to a conversation, in one call (`join`): the conversation read, the `reject`
policy's refusal before anything is written, the run id claimed for its tenant, then the
policy applied to the active run in one script (`RunStore.join`, run_create.lua), read again
and tried again while the conversation moves under it. It answers what came of it and what is
left for the caller to do (`Join`); at most one run of a conversation is ever active."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

import redis

from turnstile.worker.store import fields, keys
from turnstile.worker.store.runs import Joined, Joining, RunStore
from turnstile.worker.store.submissions import NewRun, claim_run_id, release_run_id
from turnstile.worker.store.values import text

JOIN_TRIES = 5  # a conversation that moves under a submission this often: try again later


@dataclass(frozen=True)
class Now:
    """A conversation as it is now: its active run, where a follow-up to it goes (the run that
    interrupts it, if one does) and the active run's status; "" for each that is not."""

    active: str = ""
    target: str = ""
    status: str = ""


def now(client: redis.Redis, tenant: str, conversation: str) -> Now:
    active = text(client.hget(keys.conversation(tenant, conversation), "active"))
    if not active:
        return Now()
    status, by_run = client.hmget(keys.run(tenant, active), fields.STATUS, fields.SUPERSEDE_BY)
    return Now(active, text(by_run) or active, text(status))


@dataclass(frozen=True)
class Join:
    """What a submission to a conversation came to (run_create.lua's answers, and two of its
    own: `taken`, the run id is another tenant's; `moving`, the conversation kept changing).
    `supersede` names the active run the caller ends now if no turn of it is in flight: the
    one a new run interrupts, or, for a retried submission (`exists`), the one its first
    attempt interrupted."""

    kind: Literal["created", "exists", "busy", "waiting", "interrupting", "merged", "full",
                  "taken", "moving"]  # fmt: skip
    active: str = ""  # the active run the answer names
    target: str = ""  # merged, full: the run the follow-up went (or would go) to
    fingerprint: str = ""  # exists: the stored submission's
    supersede: str = ""


def join(
    store: RunStore, run: NewRun, joining: Joining, *, held_before: bool, tries: int = JOIN_TRIES
) -> Join:
    """Submit `run` to the conversation `joining.key` under `joining.policy` (`joining.active`
    and `.target` are read here). `held_before`: the run id was the tenant's before this
    submission (a retry), so it is kept whatever comes of it."""
    client, tenant, run_id = store.client, run.tenant, run.run_id
    seen = now(client, tenant, joining.key)
    if joining.policy == "reject" and seen.active and seen.status not in ("", "stopped"):
        return Join("busy", active=seen.active)  # refused before anything is written
    if claim_run_id(client, run_id, tenant) != tenant:
        return Join("taken")
    active, target = seen.active, seen.target
    for _ in range(tries):
        asked = dataclasses.replace(joining, active=active, target=target)
        joined = store.join(**run.fields(), joining=asked)
        if joined.kind == "moved":
            active, target = joined.active, joined.target
            if not target and active:
                target = now(client, tenant, joining.key).target
            continue
        if joined.kind in ("busy", "merged", "full") and not held_before:
            release_run_id(client, run_id)  # no run of this id was made: let it go
        return _answer(client, run, joining.key, joined)
    return Join("moving")


def _answer(client: redis.Redis, run: NewRun, key: str, joined: Joined) -> Join:
    if joined.kind == "exists":
        # A retried interrupt finishes what the first attempt may not have: the run it
        # interrupts ends now if nothing of it is in flight.
        supersede = ""
        if joined.fingerprint == run.fingerprint:
            seen = now(client, run.tenant, key)
            if seen.active and seen.target == run.run_id and seen.target != seen.active:
                supersede = seen.active
        return Join("exists", fingerprint=joined.fingerprint, supersede=supersede)
    if joined.kind == "interrupting":
        return Join("interrupting", active=joined.active, supersede=joined.active)
    assert joined.kind != "moved"  # `join` reads the conversation again instead
    return Join(joined.kind, active=joined.active, target=joined.target)
