"""Request and response bodies. Requests forbid unknown fields, so a typo is an error rather
than a setting silently ignored, and their numbers and flags are strict: `true` is not 1 and
`"5"` is not 5 (pydantic would convert both)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StringConstraints,
)

from turnstile.ledger.inputs import Period
from turnstile.worker.http.context import NAME, QUEUE, RUN_ID
from turnstile.worker.ops.listing import RunRow
from turnstile.worker.scheduling.priority import DEFAULT as DEFAULT_PRIORITY
from turnstile.worker.scheduling.priority import HIGHEST, LOWEST

# A job's or a note source's name: not a name of worker/names.py's kinds, and an unknown one is
# refused by name (an unknown job is `unknown_job`).
WORD = r"^[A-Za-z0-9_.][A-Za-z0-9_.\-]{0,127}$"
Count = Field(default=None, ge=0, le=2**53)


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class BudgetBody(Strict):
    """Ceilings of one run; each one left out keeps the job's default."""

    max_steps: StrictInt | None = Count
    max_tool_calls: StrictInt | None = Count
    max_tokens: StrictInt | None = Count
    max_output_tokens: StrictInt | None = Count
    deadline_ms: StrictInt | None = Count
    max_cost_microusd: StrictInt | None = Count
    input_microusd_per_mtok: StrictInt | None = Count
    output_microusd_per_mtok: StrictInt | None = Count
    turn_tool_calls: StrictInt | None = Count
    max_repeat: StrictInt | None = Count
    max_stalls: StrictInt | None = Count
    oscillation_window: StrictInt | None = Count
    max_plan_steps: StrictInt | None = Count
    max_tool_failures: StrictInt | None = Count
    max_batch: StrictInt | None = Count


class SubmitBody(Strict):
    user: str = Field(pattern=NAME, description="The end user the run acts for.")
    goal: str = Field(min_length=1, max_length=4000)
    job: str = Field(
        pattern=WORD,
        description="The job to run, by its registered name (`turnstile jobs`); required: the"
        " API has no default job.",
    )
    params: dict[str, Any] = Field(default_factory=dict, description="The job's parameters.")
    budget: BudgetBody | None = None
    queue: str = Field(default="default", pattern=QUEUE)
    priority: StrictInt = Field(
        default=DEFAULT_PRIORITY, ge=LOWEST, le=HIGHEST,
        description=(
            "0-9: within the tenant's fair share, higher is served first; a waiting step gains"
            " a level per TURNSTILE_PRIORITY_AGING_S it has waited."
        ),
    )  # fmt: skip
    run_id: str | None = Field(
        default=None,
        pattern=RUN_ID,
        description=(
            "A key of the tenant's own, like Idempotency-Key: a retried submit with it returns"
            " the same run. The run's id is derived from it (see `run_id` in the answer),"
            " unless it is the id of a run of the tenant's already."
        ),
    )
    conversation: str | None = Field(
        default=None,
        pattern=NAME,
        description=(
            "A conversation key of the tenant's: a conversation has at most one active run"
            " (running, suspended or parked)."
        ),
    )
    conversation_policy: Literal["reject", "enqueue", "interrupt", "merge"] | None = Field(
        default=None,
        description=(
            "What this submission does when the conversation has an active run: reject (409"
            " naming it), enqueue (waits, starts when it ends), interrupt (it ends `superseded`"
            " at its next turn boundary, then this run starts) or merge (the goal is added to"
            " it as a follow-up; no run is made). Default: the job's own (support: merge;"
            " others: reject). Only with `conversation`."
        ),
    )


class Submitted(BaseModel):
    run_id: str
    tenant: str
    status: str
    created: bool = Field(description="False: the same submission was made before.")
    sent: bool = Field(description="False: stored; the step is sent when the broker is back.")
    conversation_action: str | None = Field(
        default=None,
        description=(
            "For a submission to a conversation: started, enqueued, interrupting or merged (a"
            " merge makes no run: `run_id` is the run the message went to)."
        ),
    )
    active_run: str | None = Field(
        default=None, description="The conversation's run that was active, if one was."
    )
    url: str
    events_url: str


class ProblemBody(BaseModel):
    type: str
    title: str
    status: int
    detail: str
    code: str


class RunPage(BaseModel):
    runs: list[RunRow]
    next_cursor: str | None = Field(description="Pass as `cursor` for the next page; null: done.")


# What an extension may set: the run's own limits, or a soft ceiling of the tenant's.
EXTEND_NAME = r"^(steps|tool_calls|tokens|cost_microusd|deadline_ms|tenant\.[a-z][a-z0-9_]{0,63})$"
ExtendName = Annotated[str, StringConstraints(pattern=EXTEND_NAME)]
Limit = Annotated[StrictInt, Field(ge=0, le=2**53)]


class ApproveBody(Strict):
    digest: str = Field(
        min_length=1, max_length=128, description="The held call's (or budget hold's) digest."
    )
    extend: dict[ExtendName, Limit] | None = Field(
        default=None,
        max_length=16,
        description="For a run held needs_budget: new limits by name (steps, tool_calls, tokens,"
        " cost_microusd, deadline_ms, tenant.<dimension> for a soft ceiling); none: the"
        " suggested ones.",
    )


class DenyBody(Strict):
    reason: str = Field(min_length=1, max_length=1000)


class CancelBody(Strict):
    reason: str = Field(default="cancelled through the API", min_length=1, max_length=1000)


class Decided(BaseModel):
    run_id: str
    status: str
    outcome: str
    result: str = Field(description="approved, extended, denied, cancelled or requested")
    by: str


class Dimension(BaseModel):
    ceiling: int | None
    committed: int
    reserved: int
    hard: bool
    period: str
    bucket: str


class LedgerView(BaseModel):
    tenant: str
    dimensions: dict[str, Dimension]


class ControlBody(Strict):
    by: str | None = Field(
        default=None, max_length=128, description="Who asked, recorded after the key's name."
    )


class MemoryBody(Strict):
    user: str = Field(pattern=NAME)
    text: str = Field(min_length=1, max_length=2000)
    source: str = Field(default="user_message", pattern=WORD)
    ttl_s: StrictFloat = Field(default=90 * 86400, gt=0, le=10 * 365 * 86400)


class CeilingBody(Strict):
    value: StrictInt = Field(ge=0, le=2**53, description="Cost in micro-dollars, or a count.")
    hard: StrictBool = Field(default=True, description="Hard: reservations beyond it are refused.")
    period: Period = Period.NONE
