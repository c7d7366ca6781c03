"""A run of a conversation (`Conversations`, which `Client` is made of): a submission joins
its conversation in one store call (worker/store/conversations.py `join`), which says what
came of it and what is left to do here: an interrupted run to end now, the new run's first
step to send, a refusal to raise."""

from __future__ import annotations

import msgspec

from turnstile.errors import ConversationBusyError, SubmissionConflictError, SubmissionError
from turnstile.jobs.conversations import MAX_PENDING_FOLLOWUPS, supersede
from turnstile.jobs.errors import StateFormatError
from turnstile.jobs.outcomes import Status
from turnstile.jobs.state import FollowUp, RunState
from turnstile.worker.broker.message import StepMessage
from turnstile.worker.client._submit import Sending, Submission, Submitted
from turnstile.worker.store import conversations
from turnstile.worker.store.runs import Joining, Started, now_iso

SUPERSEDE_TRIES = (
    5  # an interrupted run that changes under the ending this often is left to its step
)


def _joining(new: Submission, at: str) -> Joining:
    """The submission as run_create.lua joins it to its conversation: the run as a waiting one
    (`enqueue`, `interrupt`), or its goal as a follow-up (`merge`), and the event the active
    run (or the run a follow-up goes to) gets."""
    state = new.state
    waiting = state.copy()
    waiting.status = Status.WAITING
    followup = FollowUp(text=state.goal, at=at, id=state.run_id if new.idempotent else None)
    event = (
        {"type": "followup", "followup": msgspec.to_builtins(followup), "at": at}
        if new.policy == "merge"
        else {"type": "interrupt_requested", "by_run": state.run_id, "at": at}
    )
    return Joining(
        key=new.conversation or "", policy=new.policy, waiting_state=waiting.to_json().decode(),
        followup=msgspec.json.encode(followup).decode(), event=event,
        idempotent=new.idempotent, max_followups=MAX_PENDING_FOLLOWUPS,
    )  # fmt: skip


def _refusal(new: Submission, joined: conversations.Join) -> Exception | None:
    """The error a submission to a conversation is refused with, or None."""
    key, run_id = new.conversation, new.state.run_id
    if joined.kind == "taken":
        return SubmissionConflictError(f"run id {run_id!r} belongs to another tenant")
    if joined.kind == "moving":
        return SubmissionError(f"conversation {key!r} kept changing; try again")
    if joined.kind == "busy":
        return ConversationBusyError(
            f"conversation {key!r} has an active run {joined.active} (policy reject)",
            joined.active,
        )
    if joined.kind == "full":
        return SubmissionError(
            f"run {joined.target} of conversation {key!r} has "
            f"{MAX_PENDING_FOLLOWUPS} follow-ups it has not seen yet; try again later"
        )
    if joined.kind == "exists" and joined.fingerprint != new.digest:
        return SubmissionConflictError(f"run {run_id!r} exists with a different submission")
    return None


class Conversations(Sending):
    """Runs of conversations, for `Client`."""

    def _join(self, new: Submission, *, held_before: bool) -> Submitted:
        """A run of a conversation: its policy applied to the conversation's active run, in one
        store call; then what is left to do here."""
        state, at = new.state, now_iso()
        tenant, run_id = state.tenant, state.run_id
        joined = conversations.join(
            self.store, self._new_run(new, {"conversation": new.conversation, "at": at}),
            _joining(new, at), held_before=held_before,
        )  # fmt: skip
        refused = _refusal(new, joined)
        if refused is not None:
            raise refused
        sent = bool(joined.supersede) and self._supersede_now(tenant, joined.supersede, run_id)
        if joined.kind == "exists":
            return Submitted(run_id, False, False)
        if joined.kind == "merged":
            return Submitted(joined.target, False, False, "merged", joined.target)
        if joined.kind == "waiting":
            return Submitted(run_id, True, False, "enqueued", joined.active)
        if joined.kind == "interrupting":
            return Submitted(run_id, True, sent, "interrupting", joined.active)
        msg = StepMessage(tenant, run_id, 1, new.queue)
        return Submitted(run_id, True, self._send(msg, state), "started")

    def _supersede_now(self, tenant: str, run_id: str, by_run: str) -> bool:
        """End the interrupted run now if no turn of it is in flight (else its step does, at
        the turn's boundary). True when that started the interrupting run (its step sent)."""
        for _ in range(SUPERSEDE_TRIES):
            stored = self.store.hash(tenant, run_id)
            if stored.get("status", "stopped") == Status.STOPPED.value:
                return False
            if stored.get("supersede_by") != by_run:
                return False  # a later interrupt took it over
            try:
                state = RunState.from_json(stored["state"])
            except StateFormatError:
                return False  # its step ends it `error`, which starts the next run as well
            at = now_iso()
            supersede(state, by_run=by_run, at=at)
            left = self.store.leave(
                tenant=tenant, run_id=run_id, version=int(stored["version"]),
                old_status=stored["status"], state=state, at=at, if_idle=True,
                events=[{"type": "superseded", "by_run": by_run, "at": at}],
            )  # fmt: skip
            if left.kind == "ok":
                return left.started is not None and left.started.run_id not in self.deferred
            if left.kind == "busy":
                return False
        return False

    def _send_started(self, started: Started) -> None:
        """A conversation's waiting run that a commit made by this client started (a cancel,
        a denial, an interrupt): its first step."""
        try:
            state = RunState.from_json(started.state)
        except StateFormatError:
            return  # the sweeper sends its step, which ends it `error` with the reason
        self._send(StepMessage(started.tenant, started.run_id, 1, started.queue), state)
