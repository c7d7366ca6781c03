"""The run store's script calls, built without a server: each builder's KEYS and ARGV in the
order its script's header gives (worker/store/lua/run_*.lua), and each reply decoded."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from redis.crc import key_slot

from turnstile.ledger.keys import tenant_keys
from turnstile.worker.broker.message import StepMessage
from turnstile.worker.scheduling import fair
from turnstile.worker.settings import Settings
from turnstile.worker.store import keys
from turnstile.worker.store.records import (
    Change,
    Joining,
    committed_from,
    created_from,
    joined_from,
    loaded_from,
    marked_from,
)
from turnstile.worker.store.run_calls import (
    EVENTS_MAXLEN,
    commit_call,
    create_call,
    encode_event,
    expire_call,
    hold_call,
    join_call,
    load_call,
    mark_call,
    renew_call,
)

T, R = "acme", "run-1"
AT = "2025-01-02T03:04:05.000+00:00"
LEDGER_KEYS = len(tenant_keys(T))


def _one_slot(script_keys: list[str]) -> bool:
    return len({key_slot(k.encode()) for k in script_keys}) == 1


def _submission() -> dict[str, object]:
    return {
        "tenant": T, "run_id": R, "state_json": "{}", "fingerprint": "fp", "queue": "q",
        "job": "support", "user_id": "u", "pickup_lease_ms": 60_000,
        "event": {"type": "submitted"}, "hold": "{}", "priority": 7,
    }  # fmt: skip


def test_a_creates_keys_and_arguments_follow_run_create() -> None:
    """run_create.lua gets the run, its events, the runs index, the running set and the leases,
    then the eleven arguments of a run of no conversation, its event encoded sorted."""
    call = create_call(**_submission())  # type: ignore[arg-type]
    assert call.keys == [keys.run(T, R), keys.events(T, R), keys.runs(T),
                         keys.by_status(T, "running"), keys.leases(T)]  # fmt: skip
    assert call.args == [R, "{}", "fp", "q", "support", "u", 60_000,
                         encode_event({"type": "submitted"}), EVENTS_MAXLEN, "{}", 7]  # fmt: skip


def test_a_join_names_the_runs_it_read_or_its_own() -> None:
    """A run of a conversation adds KEYS 6-11 (the conversation, its waiting list, the active
    run, the target run and its events, the waiting set) and ARGV 12-20; a caller that read no
    active run names its own run's keys there, and a target defaults to the active run."""
    alone = join_call(**_submission(), joining=Joining("c", "enqueue"))  # type: ignore[arg-type]
    assert alone.keys[5:] == [keys.conversation(T, "c"), keys.conversation_waiting(T, "c"),
                              keys.run(T, R), keys.run(T, R), keys.events(T, R),
                              keys.by_status(T, "waiting")]  # fmt: skip
    assert alone.args[11:] == ["c", "enqueue", "", "", "", "", "", "", 50]
    merged = join_call(
        **_submission(),  # type: ignore[arg-type]
        joining=Joining("c", "merge", active="a", followup='{"text":"x"}',
                        event={"type": "followup"}, idempotent=True, max_followups=3),
    )  # fmt: skip
    assert merged.keys[7:10] == [keys.run(T, "a"), keys.run(T, "a"), keys.events(T, "a")]
    assert merged.args[11:] == ["c", "merge", "a", "", "", '{"text":"x"}',
                                encode_event({"type": "followup"}), "1", 3]  # fmt: skip
    assert _one_slot(merged.keys)


def test_the_small_scripts_calls() -> None:
    """load, renew, hold, mark and expire take their keys and arguments in their headers'
    order, every key in the tenant's slot."""
    load = load_call(tenant=T, run_id=R, version=3, inflight_lease_ms=15_000, where="q|1|h",
                     delivery="d-2", after="d-1")  # fmt: skip
    assert load.keys == [keys.run(T, R), keys.leases(T), keys.control(T), keys.inflight(T),
                         *tenant_keys(T), keys.live_readers(T, R)]  # fmt: skip
    assert load.args == [R, 3, 15_000, "q|1|h", "d-2", "d-1"]
    renew = renew_call(tenant=T, run_id=R, where="q|1|h", lease_ms=9)
    assert (renew.keys, renew.args) == ([keys.leases(T), keys.inflight(T)], [R, "q|1|h", 9])
    hold = hold_call(T, R, 4, ["res-1", "60"])
    assert (hold.keys, hold.args) == ([keys.run(T, R), *tenant_keys(T)], [4, "res-1", "60"])
    mark = mark_call(T, R, version=2, status="running", fields={"cancel_by": "ops"},
                     event={"type": "cancel_requested"})  # fmt: skip
    assert mark.keys == [keys.run(T, R), keys.events(T, R)]
    assert mark.args == [2, "running", EVENTS_MAXLEN, encode_event({"type": "cancel_requested"}),
                         "cancel_by", "ops"]  # fmt: skip
    gone = expire_call(T, R, outcome="", cutoff_ms=5)
    assert gone.keys[4] == keys.by_outcome(T, "none") and gone.args == [R, 5, ""]
    for call in (load, renew, hold, mark, gone):
        assert _one_slot(call.keys)


def test_a_commits_arguments_count_what_follows_them() -> None:
    """A commit's ARGV gives the events, the settlements (each with its length), the fields to
    clear, the hold, if_idle, the journal's length and the slot to give back in
    run_commit.lua's order; a run that goes on names no release, its outcome set is `none`'s,
    and its lease is "" when dropped. A commit that gives the step's slot back names it, and
    the tenant's slots and active runs come last in KEYS; one that also queues its next step
    is refused."""
    change = Change(
        tenant=T, run_id=R, version=4, old_status="running", status="parked",
        events=[{"type": "parked"}, {"type": "x"}], settlements=[["res-1", "1000", "tokens", "5"]],
        clear=["cancel_by", "cancel_reason"], hold="-", if_idle=True, followups_seen=2,
    )  # fmt: skip
    call = commit_call(change, head="", journal_maxlen="1000", pickup_lease_ms=60_000, at=AT)
    assert call.keys == [keys.run(T, R), keys.events(T, R), keys.leases(T),
                         keys.by_status(T, "running"), keys.by_status(T, "parked"),
                         keys.by_outcome(T, "none"), keys.inflight(T), *tenant_keys(T)]  # fmt: skip
    assert call.args == [
        R, 4, "", "parked", "", "", "", "", EVENTS_MAXLEN,
        2, encode_event({"type": "parked"}), encode_event({"type": "x"}),
        1, 4, "res-1", "1000", "tokens", "5",
        2, "cancel_by", "cancel_reason", "-", "1", "1000", "",
        2, "", "", 60_000, "",
    ]  # fmt: skip
    giving = commit_call(replace(change, slot=f"{R}:4"), head="", journal_maxlen="1000",
                         pickup_lease_ms=60_000, at=AT)  # fmt: skip
    assert giving.keys == [*call.keys, keys.slots(T), keys.active(T)]
    assert giving.args == [*call.args[:24], f"{R}:4", *call.args[25:]]
    assert _one_slot(giving.keys)
    step = fair.pending_entry(StepMessage(T, R, 5, "q"), 10.0, 12.0)
    with pytest.raises(ValueError, match="keeps its slot"):
        commit_call(replace(change, slot=f"{R}:4", next_step=step), head="",
                    journal_maxlen="1000", pickup_lease_ms=9, at=AT)  # fmt: skip


def test_a_stopping_run_of_a_conversation_releases_it_at_the_index_it_names() -> None:
    """A stopping commit of a run of a conversation appends the release's six keys at the end
    of KEYS and names where they start; the waiting run it starts gets a `started` event at
    the given time; with none waiting, its own run's keys stand in."""
    change = Change(tenant=T, run_id=R, version=2, old_status="running", status="stopped",
                    outcome="completed", conversation="c")  # fmt: skip
    call = commit_call(change, head="run-2", journal_maxlen="1000", pickup_lease_ms=9, at=AT)
    at = 7 + LEDGER_KEYS + 1
    assert call.args[-5:] == [0, at, "run-2", 9, encode_event(
        {"type": "started", "after": R, "conversation": "c", "at": AT})]  # fmt: skip
    assert call.keys[at - 1 :] == [
        keys.conversation(T, "c"),
        keys.conversation_waiting(T, "c"),
        keys.run(T, "run-2"),
        keys.events(T, "run-2"),
        keys.by_status(T, "waiting"),
        keys.by_status(T, "running"),
    ]
    assert call.keys[5] == keys.by_outcome(T, "completed")
    nobody = commit_call(change, head="", journal_maxlen="1000", pickup_lease_ms=9, at=AT)
    assert nobody.args[-3:] == ["", 9, ""] and nobody.keys[-4] == keys.run(T, R)
    assert _one_slot(call.keys) and _one_slot(nobody.keys)


def test_a_commit_queues_or_claims_the_next_step_after_the_rest() -> None:
    """With a next step, its pending keys and its entry come last; a claim asked for adds its
    keys and arguments after those (on a cluster, the tenant's keys only: one slot)."""
    following = StepMessage(T, R, 3, "q")
    step = fair.pending_entry(following, 10.0, 12.0)
    change = Change(tenant=T, run_id=R, version=2, old_status="running", status="running",
                    lease_ms=1000, next_step=step)  # fmt: skip
    queued = commit_call(change, head="", journal_maxlen="1000", pickup_lease_ms=9, at=AT)
    assert queued.keys[-3:] == step.keys
    assert queued.args[-2:] == [step.entry, step.before] and queued.args[7] == 1000
    cluster = Settings(redis_url="redis+cluster://127.0.0.1:7000", broker_url="redis://x:1/0")
    claim = fair.claim(following, 12.0, cluster, "d-3")
    claimed = commit_call(change, head="", journal_maxlen="1000", pickup_lease_ms=9, at=AT,
                          claim=claim)  # fmt: skip
    # The claim's keys, then the run's live readers, for the claimed step's load.
    assert claimed.keys[-len(claim.keys) - 1 :] == [*claim.keys, keys.live_readers(T, R)]
    assert claimed.args[-len(claim.args) :] == claim.args
    assert _one_slot(claimed.keys)


def test_the_replies_decode_as_the_scripts_give_them() -> None:
    """Each script's reply shapes (see their Returns) as the records the callers read."""
    assert created_from(["created", "1"], "fp") == (True, "fp")
    assert created_from(["exists", "other"], "fp") == (False, "other")
    assert joined_from(["merged", "a", "1"]).again
    assert joined_from(["moved", "a", "b"]).target == "b"
    assert joined_from(["full", "a"]).kind == "full"
    go = ["go", '{"s":1}', 2, "", "ops", "why", "running", "admitted", ["admitted"], "res-1",
          17, "run-9", json.dumps([{"text": "x"}]), "1"]  # fmt: skip
    loaded = loaded_from(go, 4, [b"2025", b""])
    assert loaded.watched and not loaded_from([*go[:-1], ""], 4, None).watched
    assert (loaded.kind, loaded.version, loaded.attempts, loaded.cancel_by) == ("go", 4, 2, "ops")
    assert loaded.queue_paused and not loaded.queue_draining and loaded.supersede_by == "run-9"
    assert loaded_from(["stale", "5", "running"], 4, None).version == 5
    change = Change(tenant=T, run_id=R, version=1, old_status="running", status="stopped")
    assert committed_from(["ok", 2, 0], change).version == 2
    assert committed_from(["ok", 2, 2, go], change).claimed == loaded_from(go, 2, None)
    started = committed_from(["ok", 2, 0, "run-2", "q", "{}"], change).started
    assert started is not None and (started.run_id, started.queue) == ("run-2", "q")
    assert committed_from(["ledger", "refused", "tokens"], change).detail == "refused tokens"
    assert committed_from(["missing"], change).kind == "missing"
    assert marked_from(["stale", "3", "stopped"]).detail == "stopped"
    assert marked_from(["ok", "3"]).version == 3
