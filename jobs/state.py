"""A run's state: named fields, written only by the kernel, saved as stable JSON.

The model never writes here directly. Tenant, user and goal come from the caller; plan, facts
and consumption come from validated replies and allow-listed tool results.
"""

from __future__ import annotations

import hashlib
from typing import Any, Literal

import msgspec

from turnstile.jobs.budget import Budget, Usage
from turnstile.jobs.errors import StateFormatError
from turnstile.jobs.outcomes import Outcome, Status

SCHEMA_VERSION = 1

StepStatus = Literal["pending", "done", "failed"]


class PlanStep(msgspec.Struct, kw_only=True):
    id: str
    tool: str
    depends_on: list[str]
    status: StepStatus = "pending"


class Call(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One proposed tool call, as the model asked for it (call ids are not kept)."""

    name: str
    args: dict[str, Any]
    plan_step: str | None = None


class HeldCall(msgspec.Struct, kw_only=True):
    """A call held for a person's decision, with the key it will run under when approved."""

    call: Call
    key: str
    digest: str
    reason: str

    @property
    def kind(self) -> Literal["call"]:
        """What is held, as `HeldBudget.kind` says it: "call"."""
        return "call"


class HeldBudget(msgspec.Struct, kw_only=True):
    """A run out of budget, held for a person: extend its limits, or stop it. Self-describing
    for whoever lists held decisions: `kind` "budget", the `dimensions` the next turn does not
    fit (as `budget_exhausted` names them), and per amount (steps, tool_calls, tokens,
    cost_microusd, deadline_ms) what was `spent`, what the next turn `needed`, the run's
    `limits` and the `suggested` new limits; `digest` pins an extension to this hold."""

    kind: Literal["budget"] = "budget"
    dimensions: list[str]
    spent: dict[str, int]
    needed: dict[str, int]
    limits: dict[str, int]
    suggested: dict[str, int]
    digest: str
    reason: str


class Decision(msgspec.Struct, kw_only=True, omit_defaults=True):
    """Who decided what about a run, and when (the time is the caller's, as an ISO string).
    An extension (`extended`) records the new `limits`."""

    kind: Literal["approved", "denied", "cancelled", "extended"]
    by: str
    at: str
    digest: str | None = None
    reason: str | None = None
    limits: dict[str, int] | None = None


class FollowUp(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A message the user sent to the run's conversation while the run was active (the `merge`
    policy): shown to the model from the next turn on, after the goal."""

    text: str
    at: str
    id: str | None = None  # the submission that carried it


class RecordedCall(msgspec.Struct, kw_only=True):
    """One tool call a run recorded: its turn, tool, arguments and observation."""

    turn: int
    tool: str
    args: dict[str, Any]
    observation: Any


class Origin(msgspec.Struct, kw_only=True, omit_defaults=True):
    """Where a forked run came from: the run and the turn after which it was forked (0: its
    start). An evaluation run's also names its evaluation, the mode for a call the recording
    does not have, and the origin's recorded calls (jobs/recording.py)."""

    run_id: str
    tenant: str
    turn: int
    evaluation: str | None = None
    mode: str | None = None  # replay-reads | stop-on-divergence (jobs/recording.py Mode)
    calls: list[RecordedCall] = msgspec.field(default_factory=list)


class RunState(msgspec.Struct, kw_only=True):
    """Everything about a run, saved whole after every turn: who asked for what (tenant,
    user, job, goal, params), its budget and usage, its `status` (running, suspended, parked,
    stopped), `outcome`, `detail` and `reason` once it has one, the plan, the facts, the last
    calls and their results (`last_result`), the call held for a person (`pending`) or the
    budget held for one (`held_budget`), the decisions made, the `answer`, and its
    conversation's follow-ups (`followups`). The model
    never sees it whole, only its rendered view."""

    schema_version: int = SCHEMA_VERSION
    run_id: str
    tenant: str
    user_id: str  # set by the caller, never by the model
    job: str
    goal: str  # set by the caller, never by the model
    params: dict[str, Any] = msgspec.field(default_factory=dict)
    budget: Budget = msgspec.field(default_factory=Budget)
    plan: list[PlanStep] = msgspec.field(default_factory=list)
    facts: dict[str, Any] = msgspec.field(default_factory=dict)
    last_result: Any = None
    last_calls: list[Call] = msgspec.field(default_factory=list)  # the calls behind last_result
    usage: Usage = msgspec.field(default_factory=Usage)
    seen: dict[str, int] = msgspec.field(default_factory=dict)  # call signature -> proposals
    recent: list[str] = msgspec.field(default_factory=list)  # signatures of the last turns
    stalls: int = 0
    failures: dict[str, int] = msgspec.field(default_factory=dict)  # tool -> failures in a row
    status: Status = Status.RUNNING
    outcome: Outcome | None = None
    reason: str | None = None
    detail: str | None = None
    answer: str | None = None
    unconfirmed: str | None = None  # plan step (or tool) of a write whose outcome is unknown
    pending: HeldCall | None = None
    held_budget: HeldBudget | None = None  # out of an extendable dimension, held for a person
    # Budget dimensions (steps, tool_calls, tokens, cost, deadline) whose running out suspends
    # the run `needs_budget` instead of ending it: the job's and its tenant's, at submit.
    extendable: list[str] = msgspec.field(default_factory=list)
    approval: Decision | None = None
    decisions: list[Decision] = msgspec.field(default_factory=list)
    memory: list[str] = msgspec.field(default_factory=list)  # notes recalled at the start
    conversation: str | None = None  # the tenant's conversation key, if it belongs to one
    followups: list[FollowUp] = msgspec.field(default_factory=list)  # merged user messages
    origin: Origin | None = None  # a fork's: the run and turn it started from (recording.py)
    # The version of its job the run is pinned to (jobs/versions.py): set at submit, changed
    # only by a migration; "" for a run made before versions were recorded.
    job_version: str = ""

    @property
    def held(self) -> HeldCall | HeldBudget | None:
        """What the run waits for a person to decide, whatever its kind, while it is suspended:
        a call to approve (`HeldCall`, `kind` "call": `pending`) or a budget to extend
        (`HeldBudget`, `kind` "budget": `held_budget`); None otherwise. Either is approved with
        its `digest` (`Client.approve(run_id, by=..., digest=state.held.digest)`; a budget
        with its suggested limits unless `extend` names others) or denied."""
        if self.status is not Status.SUSPENDED:
            return None
        return self.held_budget if self.held_budget is not None else self.pending

    @property
    def terminal(self) -> bool:
        """Whether the run has ended with an outcome."""
        return self.status is Status.STOPPED

    def to_json(self) -> bytes:
        """Canonical bytes: the same state always encodes to the same bytes."""
        return msgspec.json.encode(self, order="sorted")

    @staticmethod
    def from_json(data: bytes | str) -> RunState:
        """A state from its JSON; StateFormatError if it does not parse or its schema version
        is unknown."""
        try:
            head = msgspec.json.decode(data, type=_Head)
        except msgspec.DecodeError as exc:
            raise StateFormatError(f"saved state does not parse: {exc}") from exc
        if head.schema_version != SCHEMA_VERSION:
            raise StateFormatError(
                f"saved state has schema version {head.schema_version}; "
                f"this code reads version {SCHEMA_VERSION}"
            )
        try:
            return _DECODER.decode(data)
        except msgspec.DecodeError as exc:
            raise StateFormatError(f"saved state does not parse: {exc}") from exc

    def copy(self) -> RunState:
        """A deep copy, through the canonical encoding."""
        return RunState.from_json(self.to_json())

    def signature(self) -> str:
        """Hash of what counts as progress: the facts and the plan's step statuses."""
        core = {"facts": self.facts, "plan": [[s.id, s.status] for s in self.plan]}
        return hashlib.sha256(msgspec.json.encode(core, order="sorted")).hexdigest()[:12]


class _Head(msgspec.Struct):
    schema_version: int


_DECODER = msgspec.json.Decoder(RunState)
