"""Submitting a run (`Submitting`, which `Client` is made of): every input checked before
anything is written, the run stored, its first step sent; and `Sending`, what every part of
the Client holds and the one way each sends a step.

A submission is stored first and its step sent after. A broker that does not take the step
does not undo it: the run's pickup lease lapses and the sweeper sends the step
(`Submitted.sent` / `Client.deferred` say so), so an accepted run always runs.
"""

from __future__ import annotations

import difflib
import hashlib
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec
import redis

from turnstile.errors import (
    InvalidNameError,
    QueueNotAllowedError,
    SubmissionConflictError,
    SubmissionError,
    SubmissionNameError,
)
from turnstile.jobs.budget import Budget
from turnstile.jobs.conversations import policy_problem
from turnstile.jobs.errors import KernelError
from turnstile.jobs.extensions import EXTENDABLE, is_tenant
from turnstile.jobs.job import Job
from turnstile.jobs.runs import new_run
from turnstile.jobs.state import RunState
from turnstile.ledger.client import Ledger
from turnstile.ledger.results import DimensionState
from turnstile.providers import budget_for, unpriced
from turnstile.providers.config import ProviderConfig
from turnstile.providers.prices import PRICES_FILE_ENV
from turnstile.worker.broker.message import StepMessage
from turnstile.worker.client._memory import Memory
from turnstile.worker.names import check_name, check_run_id
from turnstile.worker.registry import Registry
from turnstile.worker.scheduling.limits import next_hold, time_limits
from turnstile.worker.scheduling.priority import DEFAULT as DEFAULT_PRIORITY
from turnstile.worker.scheduling.priority import check_priority
from turnstile.worker.settings import Settings
from turnstile.worker.store import queues as served_queues
from turnstile.worker.store.runs import RunStore, fingerprint, now_iso
from turnstile.worker.store.submissions import Found, NewRun, before_writing, claim_run_id

MAX_IDEMPOTENCY_KEY_CHARS = 255

Send = Callable[[StepMessage, float, float], None]


def idempotent_run_id(tenant: str, key: str) -> str:
    """The run id an idempotency key stands for: the same key of the same tenant, the same run;
    another tenant's same key, another run. Run ids are global, so a tenant that names its run
    by a key never touches, nor learns of, a run id of another tenant."""
    if not isinstance(key, str) or not key or len(key) > MAX_IDEMPOTENCY_KEY_CHARS:
        raise SubmissionError(
            f"an idempotency key is 1-{MAX_IDEMPOTENCY_KEY_CHARS} characters of text"
        )
    return "run_" + hashlib.sha256(f"{tenant}\x00{key}".encode()).hexdigest()[:24]


@dataclass(frozen=True)
class Submitted:
    """What `Client.submit_run` did: the run's id, whether this call created it (False: the
    same submission was made before), and whether its first step reached the broker (False:
    stored; the sweeper sends it)."""

    run_id: str
    created: bool  # False: the same submission was made before (idempotent on the run id)
    sent: bool  # False: stored, but the broker did not take the step; the sweeper sends it
    # A submission to a conversation: what it did ("started": the conversation had no active
    # run; "enqueued", "interrupting", "merged" by its policy; "" otherwise or when repeated),
    # and the run that was active. A merge creates no run: `run_id` is the run it went to.
    conversation_action: str = ""
    active_run: str | None = None


@dataclass
class Submission:
    """A submission whose inputs passed every check that reads nothing but the ledger."""

    state: RunState  # the new run's (its id, tenant, user, job, goal, params, budget)
    job: Job  # its job, as the registry has it
    digest: str  # the submission's fingerprint: the same one again is a retry
    queue: str
    priority: int
    idempotent: bool  # named by the caller (a run id or an idempotency key)
    conversation: str | None
    policy: str  # the conversation policy that applies (the submission's, else the job's)


def _budget(raw: Budget | Mapping[str, Any] | None, default: Budget) -> Budget:
    if raw is None:
        return default
    if isinstance(raw, Budget):
        return raw
    if not isinstance(raw, Mapping):
        raise SubmissionError(f"budget must be a Budget or a mapping, not {type(raw).__name__}")
    fields = Budget.__struct_fields__
    unknown = [str(name) for name in raw if name not in fields]
    if unknown:
        close = difflib.get_close_matches(unknown[0], fields, n=1)
        hint = f"; did you mean {close[0]}?" if close else ""
        raise SubmissionError(
            f"budget: unknown field {unknown[0]!r}{hint} (fields: {', '.join(fields)})"
        )
    try:
        return msgspec.convert({**msgspec.to_builtins(default), **dict(raw)}, Budget)
    except msgspec.ValidationError as exc:
        raise SubmissionError(f"budget: {exc}") from exc


def _check_tenant_allows(tenant: str, budget: Budget, ledger: Mapping[str, DimensionState]) -> None:
    """A run may not ask for more than its tenant's hard ceilings could ever give it."""
    asked = {"cost_microusd": budget.max_cost_microusd, "tokens": budget.max_tokens,
             "steps": budget.max_steps, "tool_calls": budget.max_tool_calls}  # fmt: skip
    for dimension, state in ledger.items():
        if state.hard and state.ceiling is not None and asked.get(dimension, 0) > state.ceiling:
            raise SubmissionError(
                f"budget asks for {asked[dimension]} {dimension}; "
                f"tenant {tenant!r} allows {state.ceiling}"
            )


def tenant_extendable(raw: object) -> tuple[str, ...]:
    """A tenant's `extendable` setting as stored ("tokens,cost"), its unknown names dropped:
    the setting is checked when written (`turnstile tenants set`)."""
    names = str(raw or "").split(",")
    return tuple(n for n in names if n in EXTENDABLE or is_tenant(n))


def _check_model_priced(
    tenant: str, params: Mapping[str, Any], job: Job, ledger: Mapping[str, DimensionState],
    providers: ProviderConfig,
) -> None:  # fmt: skip
    """A tenant with a cost ceiling only runs models whose spend can be priced: the run's
    model and its fallback."""
    spec = unpriced(params, providers, job)
    cost = ledger.get("cost_microusd")
    if spec and cost is not None and cost.ceiling is not None:
        raise SubmissionError(
            f"model {spec!r} has no price and tenant {tenant!r} has a cost ceiling: add its"
            f" price to the file named in {PRICES_FILE_ENV}"
        )


def _check_conversation(conversation: str | None, policy: str | None) -> None:
    """A conversation key is a name (worker/names.py); a policy is one of the four, and only
    with a key."""
    if policy is not None and conversation is None:
        raise SubmissionError("a conversation policy needs a conversation key")
    problem = policy_problem(policy) if policy is not None else None
    if problem:
        raise SubmissionError(problem)
    if conversation is not None:
        check_name("conversation", conversation)


class Sending:
    """What every part of `Client` holds, and the one way each sends a step."""

    client: redis.Redis
    config: Settings
    send: Send  # where a step goes: the broker, or its tenant's pending list (fair.route)
    jobs: Registry
    ledger: Ledger
    store: RunStore
    deferred: list[str]  # runs whose step the broker did not take (the sweeper sends them)

    def _send(self, msg: StepMessage, state: RunState) -> bool:
        """Send the step; False when the broker did not take it. The run is stored with a
        pickup lease, so the sweeper sends the step when the lease lapses: the caller is told
        the run was accepted, never that it failed (it would run anyway)."""
        soft_s, hard_s = time_limits(state, self.config)
        try:
            self.send(msg, soft_s, hard_s)
        except Exception:  # any failure of the broker client: the sweeper covers it
            self.deferred.append(msg.run_id)
            return False
        return True

    def _new_run(self, new: Submission, event: dict[str, Any]) -> NewRun:
        """The run as the store takes it, with its first event and its first turn's hold."""
        state = new.state
        return NewRun(
            tenant=state.tenant, run_id=state.run_id, state_json=state.to_json().decode(),
            fingerprint=new.digest, queue=new.queue, job=state.job, user_id=state.user_id,
            pickup_lease_ms=int(self.config.pickup_lease_s * 1000),
            event={"type": "submitted", "state": msgspec.to_builtins(state), "queue": new.queue,
                   "priority": new.priority, **event},
            hold=next_hold(self.ledger, self.config, state, new.job, version=1),
            priority=new.priority,
        )  # fmt: skip


class Submitting(Sending, Memory):
    """Submitting runs, for `Client`."""

    if TYPE_CHECKING:  # the Client's `Conversations` part

        def _join(self, new: Submission, *, held_before: bool) -> Submitted: ...

    def submit(
        self,
        tenant: str,
        user: str,
        job: str,
        goal: str,
        params: Mapping[str, Any] | None = None,
        *,
        budget: Budget | Mapping[str, Any] | None = None,
        queue: str = "default",
        run_id: str | None = None,
        idempotency_key: str | None = None,
        priority: int = DEFAULT_PRIORITY,
        conversation: str | None = None,
        conversation_policy: str | None = None,
    ) -> str:
        """Create the run and enqueue its first step; idempotent on `run_id` (or on
        `idempotency_key`, a key of the tenant's own). `priority` (0-9, default 5): within the
        tenant's fair share, higher is served first (see docs/scheduling.md, "Priorities"). With a
        `conversation` key, see `submit_run`."""
        return self.submit_run(
            tenant, user, job, goal, params, budget=budget, queue=queue, run_id=run_id,
            idempotency_key=idempotency_key, priority=priority, conversation=conversation,
            conversation_policy=conversation_policy,
        ).run_id  # fmt: skip

    def submit_run(
        self,
        tenant: str,
        user: str,
        job: str,
        goal: str,
        params: Mapping[str, Any] | None = None,
        *,
        budget: Budget | Mapping[str, Any] | None = None,
        queue: str = "default",
        run_id: str | None = None,
        idempotency_key: str | None = None,
        priority: int = DEFAULT_PRIORITY,
        conversation: str | None = None,
        conversation_policy: str | None = None,
    ) -> Submitted:
        """`submit`, saying whether the run was new and whether its step reached the broker.
        `idempotency_key` names the run by a key of the tenant's own (`idempotent_run_id`), as
        the HTTP API does; `run_id` names the global run id itself.

        `conversation` (a name of the tenant's) makes the run one of a conversation, which has
        at most one active run. When it has one, `conversation_policy` (else the job's own)
        decides: `reject` (ConversationBusyError naming the active run), `enqueue` (stored
        `waiting`, started when the active run ends), `interrupt` (the active run ends
        `superseded` at its next turn boundary, then this one starts) or `merge` (no run: the
        goal goes to the active run as a follow-up its next turn sees)."""
        if run_id is not None and idempotency_key is not None:
            raise SubmissionError("give an idempotency key or a run id, not both")
        priority = check_priority(priority)
        idempotent = run_id is not None or idempotency_key is not None
        try:
            _check_conversation(conversation, conversation_policy)
            if idempotency_key is not None:
                run_id = idempotent_run_id(tenant, idempotency_key)
            run_id = f"run_{uuid.uuid4().hex[:20]}" if run_id is None else check_run_id(run_id)
            state = self._new_state(
                tenant=tenant, user=user, job=job, goal=goal, params=params, budget=budget,
                queue=queue, run_id=run_id,
            )  # fmt: skip
        except InvalidNameError as exc:  # a bad name refuses the submission: it is both
            raise SubmissionNameError(str(exc)) from exc
        new = self._submission(
            state, queue=queue, priority=priority, conversation=conversation,
            policy=conversation_policy, idempotent=idempotent,
        )  # fmt: skip
        # Every refusal is found by reading before anything is written: a refused submission
        # adds no queue, no tenant and no run id to any index.
        found = before_writing(self.client, queue, tenant, state.run_id)
        self._check_found(new, found)
        if conversation is not None:
            return self._join(new, held_before=found.owner is not None)
        return self._create(new)

    def submit_state(
        self,
        state: RunState,
        *,
        queue: str = "default",
        priority: int = DEFAULT_PRIORITY,
        event: Mapping[str, Any] | None = None,
    ) -> Submitted:
        """A run that starts from a state built elsewhere (a fork's: worker/ops/fork.py), under
        the state's run id, checked as any submission is (its names, its budget against its
        tenant's ceilings, its model's price, its queue) before anything is written; `event`
        goes into its `submitted` event. Idempotent on the run id and the state's origin."""
        priority = check_priority(priority)
        try:
            for kind, name in (("tenant", state.tenant), ("user", state.user_id),
                               ("queue", queue)):  # fmt: skip
                check_name(kind, name)
            check_run_id(state.run_id)
        except InvalidNameError as exc:
            raise SubmissionNameError(str(exc)) from exc
        new = self._submission(
            state, queue=queue, priority=priority, conversation=None, policy=None,
            idempotent=True,
        )  # fmt: skip
        origin = msgspec.to_builtins(state.origin) if state.origin is not None else None
        new.digest = fingerprint(
            [new.digest, origin and {k: origin.get(k) for k in ("run_id", "turn", "evaluation")}]
        )
        found = before_writing(self.client, queue, state.tenant, state.run_id)
        self._check_found(new, found)
        return self._create(new, event)

    def _submission(
        self, state: RunState, *, queue: str, priority: int, conversation: str | None,
        policy: str | None, idempotent: bool,
    ) -> Submission:  # fmt: skip
        """The submission, checked against its tenant's ledger (read once: its hard ceilings
        and whether it has a cost ceiling), with its fingerprint."""
        ceilings = self.ledger.read(state.tenant)
        definition = self.jobs.get(state.job)
        _check_tenant_allows(state.tenant, state.budget, ceilings)
        _check_model_priced(state.tenant, state.params, definition, ceilings, self.config.providers)
        policy = policy or definition.conversation_policy.value
        asked: list[Any] = [state.tenant, state.user_id, state.job, state.goal, state.params,
                            state.budget, queue]  # fmt: skip
        if priority != DEFAULT_PRIORITY:  # a run of the default keeps the fingerprint it had
            asked.append({"priority": priority})
        digest = fingerprint([*asked, conversation, policy] if conversation else asked)
        if conversation is not None:
            state.conversation = conversation
        return Submission(
            state, definition, digest, queue, priority, idempotent, conversation, policy
        )

    def _check_found(self, new: Submission, found: Found) -> None:
        """The refusals a read finds: a queue closed to the tenant or draining, a run id of
        another tenant's, or of another submission."""
        state, queue, run_id = new.state, new.queue, new.state.run_id
        refused = served_queues.refusal(
            queue, tenant=state.tenant, tenant_list=found.tenant_queues,
            listed=self.config.submit_queue_names, is_served=found.served,
            default_queue=self.config.default_queue,
        )  # fmt: skip
        if refused is not None:
            raise QueueNotAllowedError(refused)
        state.extendable = sorted(set(state.extendable) | set(tenant_extendable(found.extendable)))
        if found.draining:
            raise SubmissionError(f"queue {queue!r} is draining: it takes no new runs")
        if found.owner not in (None, state.tenant):
            raise SubmissionConflictError(f"run id {run_id!r} belongs to another tenant")
        if found.fingerprint is not None and found.fingerprint != new.digest:
            raise SubmissionConflictError(f"run {run_id!r} exists with a different submission")

    def _create(self, new: Submission, event: Mapping[str, Any] | None = None) -> Submitted:
        """Store the run (not of a conversation), then send its first step."""
        state, run_id = new.state, new.state.run_id
        if claim_run_id(self.client, run_id, state.tenant) != state.tenant:
            # another tenant took the id since it was read
            raise SubmissionConflictError(f"run id {run_id!r} belongs to another tenant")
        first = {"at": now_iso(), **(event or {})}
        created, stored = self.store.create(**self._new_run(new, first).fields())
        if not created and stored != new.digest:
            raise SubmissionConflictError(f"run {run_id!r} exists with a different submission")
        msg = StepMessage(state.tenant, run_id, 1, new.queue)
        return Submitted(run_id, created, created and self._send(msg, state))

    def _new_state(
        self, *, tenant: str, user: str, job: str, goal: str, params: Mapping[str, Any] | None,
        budget: Budget | Mapping[str, Any] | None, queue: str, run_id: str,
    ) -> RunState:  # fmt: skip
        check_name("tenant", tenant)
        check_name("user", user)
        check_name("queue", queue)
        if not isinstance(goal, str) or len(goal) > self.config.max_goal_chars:
            raise SubmissionError(
                f"goal must be text of at most {self.config.max_goal_chars} characters"
            )
        if params is not None and not isinstance(params, Mapping):
            raise SubmissionError(f"params must be a JSON object, not {type(params).__name__}")
        try:
            size = len(msgspec.json.encode(params or {}))
        except (TypeError, ValueError) as exc:
            raise SubmissionError(f"params must be JSON: {exc}") from exc
        if size > self.config.max_params_bytes:
            raise SubmissionError(
                f"params are {size} bytes; at most {self.config.max_params_bytes}"
            )
        try:
            definition = self.jobs.get(job)
            chosen = budget_for(
                params or {}, _budget(budget, definition.budget), self.config.providers,
                default=budget is None, job=definition,
            )  # fmt: skip
            if chosen.deadline_ms > self.config.max_deadline_s * 1000:
                raise SubmissionError(
                    f"deadline above the {self.config.max_deadline_s:.0f} s a run may have"
                )
            return new_run(
                run_id=run_id, tenant=tenant, user_id=user, job=definition, goal=goal,
                params=params, budget=chosen, memory=self.recall(tenant, user, goal),
            )  # fmt: skip
        except KernelError as exc:
            raise SubmissionError(str(exc)) from exc
