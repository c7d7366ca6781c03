"""Conversations: runs that share a key of their tenant's, at most one of them active at a time.

A submission to a conversation that has an active run follows a policy: refused (`reject`),
started when the active one ends (`enqueue`), started instead of it (`interrupt`: the active
run ends `superseded` at its next turn boundary), or added to it as a follow-up from the user
(`merge`: the run's next turn sees it in its view). A job declares its default policy; a
submission may name another. Pure: the store's scripts keep the one-active rule.
"""

from __future__ import annotations

import json
from enum import StrEnum

from turnstile.jobs.outcomes import Outcome, Status
from turnstile.jobs.state import FollowUp, RunState

MAX_PENDING_FOLLOWUPS = 50  # merged messages a run has not seen yet; one more is refused
FOLLOWUPS_KEY = "followups"  # the view's key (a JSON view) for the user's follow-ups


class ConversationPolicy(StrEnum):
    """What a submission does to a conversation that has an active run."""

    REJECT = "reject"
    ENQUEUE = "enqueue"
    INTERRUPT = "interrupt"
    MERGE = "merge"


POLICIES = tuple(p.value for p in ConversationPolicy)


def policy_problem(value: object) -> str | None:
    """One line saying why `value` is not a conversation policy, or None."""
    if isinstance(value, str) and value in POLICIES:
        return None
    return f"unknown conversation policy {value!r}; one of {', '.join(POLICIES)}"


def receive(state: RunState, followups: list[FollowUp]) -> None:
    """Messages merged into the run since its last turn, added to its state in order: the next
    turn's view shows them."""
    state.followups.extend(followups)


def start(state: RunState) -> None:
    """A waiting run of a conversation whose turn has come: it runs like any new run."""
    if state.status is Status.WAITING:
        state.status = Status.RUNNING


def supersede(state: RunState, *, by_run: str, at: str) -> None:
    """The run ends `superseded`: a newer submission to its conversation interrupted it."""
    del at  # recorded by the caller's event; the kernel keeps no clock
    state.status = Status.STOPPED
    state.outcome = Outcome.SUPERSEDED
    state.reason = f"interrupted by run {by_run} of conversation {state.conversation}"
    state.detail = None


def with_followups(view: str, state: RunState) -> str:
    """The view with the run's follow-ups in it, for a job whose own render leaves them out: a
    JSON object gets a `followups` key, any other text a labelled block at its end."""
    if not state.followups:
        return view
    texts = [f.text for f in state.followups]
    try:
        shown = json.loads(view)
    except ValueError:
        shown = None
    if isinstance(shown, dict):
        if FOLLOWUPS_KEY in shown:
            return view
        shown[FOLLOWUPS_KEY] = texts
        return json.dumps(shown, sort_keys=True)
    if all(t in view for t in texts):
        return view
    lines = "\n".join(f"- {t}" for t in texts)
    return f"{view}\n\nFollow-up messages from the user, oldest first:\n{lines}"
