"""The Python API for services that enqueue work: submit a run, read it, decide on it.

Every input is checked before anything is written: an unknown job, a budget above what the
tenant allows, an oversized goal or params, a tenant, user, queue or run id outside the one
rule for names (worker/names.py) are clear errors.

A submission or a decision is stored first and its step sent after. A broker that does not
take the step does not undo it: the run's pickup lease lapses and the sweeper sends the step
(`Submitted.sent` / `Client.deferred` say so), so an accepted run always runs.
"""

from __future__ import annotations

import difflib
import hashlib
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Self

import msgspec
import redis

from turnstile.errors import (
    ConversationBusyError,
    DecisionRefusedError,
    InvalidNameError,
    QueueNotAllowedError,
    SubmissionConflictError,
    SubmissionError,
    SubmissionNameError,
)
from turnstile.jobs.budget import Budget
from turnstile.jobs.conversations import MAX_PENDING_FOLLOWUPS, policy_problem, supersede
from turnstile.jobs.decisions import approve as kernel_approve
from turnstile.jobs.decisions import cancel as kernel_cancel
from turnstile.jobs.decisions import deny as kernel_deny
from turnstile.jobs.errors import KernelError, StateFormatError
from turnstile.jobs.extensions import EXTENDABLE, TENANT, is_tenant
from turnstile.jobs.job import Job
from turnstile.jobs.outcomes import Status
from turnstile.jobs.runs import new_run
from turnstile.jobs.state import FollowUp, RunState
from turnstile.ledger.client import Ledger
from turnstile.ledger.inputs import DEFAULT_DIMENSIONS
from turnstile.ledger.results import DimensionState
from turnstile.providers import budget_for, unpriced
from turnstile.providers.config import ProviderConfig
from turnstile.providers.prices import PRICES_FILE_ENV
from turnstile.worker.broker.message import StepMessage
from turnstile.worker.broker.producer import sender
from turnstile.worker.client._edge import guard_store
from turnstile.worker.client._memory import Memory
from turnstile.worker.client._reading import FOLLOW_BLOCK_MS, Reading
from turnstile.worker.client._room import call_charges, no_room
from turnstile.worker.names import check_name, check_run_id
from turnstile.worker.registry import Registry
from turnstile.worker.scheduling.fair import route
from turnstile.worker.scheduling.limits import next_hold, time_limits
from turnstile.worker.scheduling.priority import DEFAULT as DEFAULT_PRIORITY
from turnstile.worker.scheduling.priority import check_priority
from turnstile.worker.settings import Settings
from turnstile.worker.store import keys
from turnstile.worker.store import queues as served_queues
from turnstile.worker.store.connect import connect
from turnstile.worker.store.durability import check_server
from turnstile.worker.store.memory import RedisMemory
from turnstile.worker.store.runs import (
    Change,
    Joined,
    Joining,
    RunStore,
    Started,
    StoreUnavailable,
    fingerprint,
    now_iso,
)

MAX_IDEMPOTENCY_KEY_CHARS = 255
CANCEL_TRIES = 5  # a run that moves on under a cancel this often is refused; try again
RUN_TENANTS = keys.RUN_TENANTS


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


Send = Callable[[StepMessage, float, float], None]


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


def _check_extension_allowed(
    tenant: str,
    state: RunState,
    limits: Mapping[str, int],
    ledger: Mapping[str, DimensionState],
    max_deadline_ms: int,
) -> None:
    """An extension never passes the tenant's hard ceilings: no new limit above a hard
    ceiling, and no more room for the run than the tenant has left under one. Only the run's
    own limits are extended (and the deadline only up to the most a run may have)."""
    for name, limit in limits.items():
        if is_tenant(name):  # a ceiling of the tenant's: only a soft one is ever extended
            dimension = name.removeprefix(TENANT)
            row = ledger.get(dimension)
            if row is None or row.ceiling is None:
                raise DecisionRefusedError(f"tenant {tenant!r} has no {dimension} ceiling now")
            if row.hard:
                raise DecisionRefusedError(
                    f"tenant {tenant!r}'s {dimension} ceiling is hard now: it is never extended"
                )
            continue
        if name == "deadline_ms":
            if limit > max_deadline_ms:
                raise DecisionRefusedError(
                    f"deadline_ms={limit} is above the {max_deadline_ms} ms a run may have"
                )
            continue
        row = ledger.get(name)
        if row is None or not row.hard or row.ceiling is None:
            continue
        if limit > row.ceiling:
            raise DecisionRefusedError(
                f"{name}={limit} would pass tenant {tenant!r}'s hard {name} ceiling of "
                f"{row.ceiling}: it is never extended"
            )
        more = limit - int(getattr(state.usage, name))
        left = max(0, row.ceiling - row.committed - row.reserved)
        if more > left:
            raise DecisionRefusedError(
                f"{name}={limit} would let the run spend {more} more {name}; tenant "
                f"{tenant!r} has {left} left under its hard ceiling of {row.ceiling}"
            )


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


@guard_store
class Client(Reading, Memory):
    """A service's handle on Turnstile: submit runs, read them, wait for them, follow their
    events, decide on held calls, and keep a tenant's users' long-term notes.

    Made by `connect_client(Settings(redis_url=...))`. It reads and writes the store the
    workers use and sends steps through a private producer: it builds no Celery app of the
    caller's. Every input is checked before anything is written; a refusal is a
    `SubmissionError` (or `DecisionRefusedError`) with a one-line message. A store that cannot
    be reached is a `StoreUnavailableError` naming its URL (the password hidden), from every
    method, the iteration of `events` included. One Client may be shared by the threads of a
    process (its Redis client is a connection pool)."""

    def __init__(self, client: redis.Redis, config: Settings, send: Send) -> None:
        # A durable mode the server cannot give is refused before anything is written.
        check_server(client, config.wait_for)
        # Where a step goes (the broker, or its tenant's pending list): worker/scheduling/fair.py.
        self.client, self.config, self.send = client, config, route(client, config, send)
        self.jobs = Registry.from_settings(
            config, client
        )  # the jobs this process can see: entry points, TURNSTILE_JOBS
        self.ledger = Ledger(
            client, grace_s=config.ledger_grace_s,
            dimensions=(*DEFAULT_DIMENSIONS, *self.jobs.dimensions()),
        )  # fmt: skip
        self.store = RunStore(
            client, self.ledger, wait_for=config.wait_for, jobs=self.jobs,
            pickup_lease_ms=int(config.pickup_lease_s * 1000),
        )  # fmt: skip
        self.store.on_started = self._send_started
        self.memory = RedisMemory(client)
        self.deferred: list[str] = []  # runs whose step the broker did not take (sweeper sends)
        # A blocking read of a run's events ends before the socket's timeout would.
        self.block_ms = max(10, min(FOLLOW_BLOCK_MS, int(config.redis_timeout_s * 1000) - 200))

    def close(self) -> None:
        """Close the client's connections to the store (the ledger and memory share them)."""
        self.client.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- submitting ------------------------------------------------------------------------

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
        # The tenant's ledger, read once: its hard ceilings and whether it has a cost ceiling.
        ceilings = self.ledger.read(tenant)
        _check_tenant_allows(tenant, state.budget, ceilings)
        _check_model_priced(
            tenant, state.params, self.jobs.get(job), ceilings, self.config.providers
        )
        policy = conversation_policy or self.jobs.get(job).conversation_policy.value
        asked: list[Any] = [tenant, user, job, goal, state.params, state.budget, queue]
        if priority != DEFAULT_PRIORITY:  # a run of the default keeps the fingerprint it had
            asked.append({"priority": priority})
        digest = fingerprint([*asked, conversation, policy] if conversation else asked)
        # Every refusal is found by reading before anything is written: a refused submission
        # adds no queue, no tenant and no run id to any index.
        draining, owner, stored_digest, extendable, refused = self._before_writing(
            queue, tenant, run_id
        )
        if refused is not None:
            raise QueueNotAllowedError(refused)
        state.extendable = sorted(set(state.extendable) | set(extendable))
        if draining:
            raise SubmissionError(f"queue {queue!r} is draining: it takes no new runs")
        if owner not in (None, tenant):
            raise SubmissionConflictError(f"run id {run_id!r} belongs to another tenant")
        if stored_digest is not None and stored_digest != digest:
            raise SubmissionConflictError(f"run {run_id!r} exists with a different submission")
        if conversation is not None:
            state.conversation = conversation
            return self._join(
                state, digest, conversation, policy, queue=queue, idempotent=idempotent,
                claimed=owner, priority=priority,
            )  # fmt: skip
        owner = self._claim_run_id(run_id, tenant)
        if owner != tenant:  # another tenant took the id since it was read
            raise SubmissionConflictError(f"run id {run_id!r} belongs to another tenant")
        created, stored = self.store.create(
            tenant=tenant, run_id=run_id, state_json=state.to_json().decode(), fingerprint=digest,
            queue=queue, job=job, user_id=user,
            pickup_lease_ms=int(self.config.pickup_lease_s * 1000),
            event={
                "type": "submitted", "state": msgspec.to_builtins(state), "queue": queue,
                "priority": priority, "at": now_iso(),
            },
            hold=next_hold(self.ledger, self.config, state, self.jobs.get(job), version=1),
            priority=priority,
        )  # fmt: skip
        if not created and stored != digest:
            raise SubmissionConflictError(f"run {run_id!r} exists with a different submission")
        sent = created and self._send(StepMessage(tenant, run_id, 1, queue), state)
        return Submitted(run_id, created, sent)

    def _join(
        self, state: RunState, digest: str, conversation: str, policy: str, *, queue: str,
        idempotent: bool, claimed: str | None, priority: int,
    ) -> Submitted:  # fmt: skip
        """A run of a conversation: its policy applied to the conversation's active run, in
        one script (RunStore.join), read again and retried when the conversation moved on."""
        tenant, run_id = state.tenant, state.run_id
        active, target, status = self._conversation_now(tenant, conversation)
        if policy == "reject" and active and status not in ("", "stopped"):
            raise self._busy(conversation, active)  # refused before anything is written
        if self._claim_run_id(run_id, tenant) != tenant:
            raise SubmissionConflictError(f"run id {run_id!r} belongs to another tenant")
        at = now_iso()
        waiting = state.copy()
        waiting.status = Status.WAITING
        followup = FollowUp(text=state.goal, at=at, id=run_id if idempotent else None)
        for _ in range(CANCEL_TRIES):
            on_target = (
                {"type": "followup", "followup": msgspec.to_builtins(followup), "at": at}
                if policy == "merge"
                else {"type": "interrupt_requested", "by_run": run_id, "at": at}
            )  # fmt: skip
            joined = self.store.join(
                tenant=tenant, run_id=run_id, state_json=state.to_json().decode(),
                fingerprint=digest, queue=queue, job=state.job,
                user_id=state.user_id, pickup_lease_ms=int(self.config.pickup_lease_s * 1000),
                event={"type": "submitted", "state": msgspec.to_builtins(state),
                       "queue": queue, "priority": priority, "conversation": conversation,
                       "at": at},
                hold=next_hold(self.ledger, self.config, state, self.jobs.get(state.job),
                               version=1),
                priority=priority,
                joining=Joining(
                    key=conversation, policy=policy, active=active, target=target,
                    waiting_state=waiting.to_json().decode(),
                    followup=msgspec.json.encode(followup).decode(), event=on_target,
                    idempotent=idempotent, max_followups=MAX_PENDING_FOLLOWUPS,
                ),
            )  # fmt: skip
            if joined.kind != "moved":
                return self._joined(
                    state, joined, digest, conversation, queue=queue, claimed=claimed
                )
            active, target = joined.active, joined.target
            if not target and active:
                target = self._conversation_now(tenant, conversation)[1]
        raise SubmissionError(f"conversation {conversation!r} kept changing; try again")

    def _joined(
        self, state: RunState, joined: Joined, digest: str, conversation: str, *, queue: str,
        claimed: str | None,
    ) -> Submitted:  # fmt: skip
        tenant, run_id = state.tenant, state.run_id
        if joined.kind in ("busy", "merged", "full") and claimed is None:
            self.client.hdel(RUN_TENANTS, run_id)  # no run of this id was made: let it go
        if joined.kind == "busy":
            raise self._busy(conversation, joined.active)
        if joined.kind == "full":
            raise SubmissionError(
                f"run {joined.target} of conversation {conversation!r} has "
                f"{MAX_PENDING_FOLLOWUPS} follow-ups it has not seen yet; try again later"
            )
        if joined.kind == "exists":
            if joined.fingerprint != digest:
                raise SubmissionConflictError(f"run {run_id!r} exists with a different submission")
            # A retried interrupt finishes what the first attempt may not have: the run it
            # interrupts ends now if nothing of it is in flight.
            active, target, _ = self._conversation_now(tenant, conversation)
            if active and target == run_id and target != active:
                self._supersede_now(tenant, active, run_id)
            return Submitted(run_id, False, False)
        if joined.kind == "merged":
            return Submitted(joined.target, False, False, "merged", joined.target)
        if joined.kind == "waiting":
            return Submitted(run_id, True, False, "enqueued", joined.active)
        if joined.kind == "interrupting":
            sent = self._supersede_now(tenant, joined.active, run_id)
            return Submitted(run_id, True, sent, "interrupting", joined.active)
        msg = StepMessage(tenant, run_id, 1, queue)
        return Submitted(run_id, True, self._send(msg, state), "started")

    @staticmethod
    def _busy(conversation: str, active: str) -> ConversationBusyError:
        return ConversationBusyError(
            f"conversation {conversation!r} has an active run {active} (policy reject)", active
        )

    def _conversation_now(self, tenant: str, conversation: str) -> tuple[str, str, str]:
        """The conversation's active run, where a follow-up to it goes (the run that
        interrupts it, if one does) and its status; "" for each that is not."""
        active = self.client.hget(keys.conversation(tenant, conversation), "active")
        if active is None:
            return "", "", ""
        status, by_run = self.client.hmget(keys.run(tenant, str(active)), "status",
                                           "supersede_by")  # fmt: skip
        return str(active), str(by_run or active), str(status or "")

    def _supersede_now(self, tenant: str, run_id: str, by_run: str) -> bool:
        """End the interrupted run now if no turn of it is in flight (else its step does, at
        the turn's boundary). True when that started the interrupting run (its step sent)."""
        for _ in range(CANCEL_TRIES):
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

    def _before_writing(
        self, queue: str, tenant: str, run_id: str
    ) -> tuple[bool, str | None, str | None, tuple[str, ...], str | None]:
        """In one round trip: whether the queue is draining, the tenant that holds the run id
        (None: no one yet), the fingerprint of the tenant's run of that id, if any, the
        budget dimensions the tenant made extendable, and why the tenant may not submit to
        the queue (None: it may; worker/store/queues.py)."""
        pipe = self.client.pipeline(transaction=False)
        pipe.hget(keys.queue_control(queue), "draining")
        pipe.hget(RUN_TENANTS, run_id)
        pipe.hget(keys.run(tenant, run_id), "fingerprint")
        pipe.hmget(keys.caps(tenant), "extendable", served_queues.TENANT_QUEUES)
        pipe.hexists(keys.SERVED_QUEUES, queue)
        draining, owner, stored, (extendable, own_queues), is_served = pipe.execute()
        refused = served_queues.refusal(
            queue, tenant=tenant, tenant_list=served_queues.tenant_queues(own_queues),
            listed=self.config.submit_queue_names, is_served=bool(is_served),
            default_queue=self.config.default_queue,
        )  # fmt: skip
        return (
            bool(draining),
            None if owner is None else str(owner),
            None if stored is None else str(stored),
            tenant_extendable(extendable),
            refused,
        )

    def _claim_run_id(self, run_id: str, tenant: str) -> str:
        pipe = self.client.pipeline(transaction=False)
        pipe.hsetnx(RUN_TENANTS, run_id, tenant)
        pipe.hget(RUN_TENANTS, run_id)
        return str(pipe.execute()[1])

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

    # -- deciding --------------------------------------------------------------------------

    def _decide(
        self,
        run_id: str,
        by: str,
        apply: Callable[[RunState], dict[str, Any]],
        *,
        if_idle: bool = False,
    ) -> RunState:
        tenant, stored = self.run_hash(run_id)
        state = RunState.from_json(stored["state"])
        try:
            event = apply(state)
        except KernelError as exc:
            raise DecisionRefusedError(str(exc)) from exc
        at = state.decisions[-1].at if state.decisions else now_iso()
        event.update(by=by, at=at)  # the decision's own time: the record and the state agree
        events = [event]
        if state.status is Status.STOPPED:  # a denial or a cancel ends the run here and now
            left = self.store.leave(
                tenant=tenant, run_id=run_id, version=int(stored["version"]),
                old_status=stored["status"], state=state, events=events, at=at,
                clear=["cancel_by", "cancel_reason"], if_idle=if_idle,
            )  # fmt: skip
            if left.kind != "ok":
                raise DecisionRefusedError(
                    f"run {run_id} changed while deciding ({left.kind}); try again"
                )
            return state
        live = state.status is Status.RUNNING
        committed = self.store.commit(
            Change(
                tenant=tenant, run_id=run_id, version=int(stored["version"]),
                old_status=stored["status"], status=state.status.value,
                state_json=state.to_json().decode(),
                outcome=state.outcome.value if state.outcome else "",
                detail=state.detail or "", reason=state.reason or "",
                lease_ms=int(self.config.pickup_lease_s * 1000) if live else None,
                events=events,
                hold=next_hold(
                    self.ledger, self.config, state, self.jobs.get(state.job),
                    version=int(stored["version"]) + 1,
                ) if live else "-",
            )
        )  # fmt: skip
        if committed.kind != "ok":
            raise DecisionRefusedError(
                f"run {run_id} changed while deciding ({committed.kind}); try again"
            )
        if live:  # a broker that does not take the step leaves it to the sweeper (self.deferred)
            self._send(StepMessage(tenant, run_id, committed.version, stored["queue"]), state)
        return state

    def _raise_soft_ceilings(
        self,
        tenant: str,
        digest: str,
        limits: Mapping[str, int],
        ledger: Mapping[str, DimensionState],
    ) -> None:
        """An extension of the tenant's soft ceilings (`tenant.<dimension>`), set before the
        run is resumed, so its step is admitted under them. Idempotent per hold: the same
        extension again is a replay; another one for the same hold is a LedgerConflict."""
        for name, limit in limits.items():
            if is_tenant(name):
                dimension = name.removeprefix(TENANT)
                row = ledger[dimension]
                if row.ceiling is not None and row.ceiling >= limit:
                    continue  # raised as far since the hold: an extension never lowers it
                self.ledger.set_ceiling(
                    tenant, dimension, limit, hard=False, period=row.period.value,
                    op_id=f"extend:{digest}:{dimension}",
                )  # fmt: skip

    def approve(
        self,
        run_id: str,
        *,
        by: str,
        digest: str | None = None,
        extend: Mapping[str, int] | None = None,
    ) -> RunState:
        """Approve what a suspended run holds (`state.held`, either kind; its `digest` pins
        it). A call: exactly that tool with those arguments; the run goes on. A budget (a run
        held `needs_budget`): an extension, `extend` mapping amounts (steps, tool_calls, tokens,
        cost_microusd, deadline_ms) to new limits (None: the hold's suggestion); the run
        re-admits with them. Refused (DecisionRefusedError) if the run is not suspended, holds
        another call or hold, the call charges a dimension whose hard ceiling has no room left
        for it, or the extension would pass a hard ceiling of its tenant's; nothing is written
        then."""

        def apply(state: RunState) -> dict[str, Any]:
            held = state.held_budget
            kernel_approve(state, by=by, at=now_iso(), digest=digest, extend=extend)
            decision = state.decisions[-1]
            if held is not None:
                assert decision.limits is not None
                ledger = self.ledger.read(state.tenant)
                _check_extension_allowed(
                    state.tenant, state, decision.limits, ledger,
                    int(self.config.max_deadline_s * 1000),
                )  # fmt: skip
                self._raise_soft_ceilings(state.tenant, held.digest, decision.limits, ledger)
                return {"type": "decision", "kind": "extended", "digest": decision.digest,
                        "dimensions": held.dimensions, "limits": decision.limits}  # fmt: skip
            assert state.approval is not None
            self._check_affordable(state)
            return {"type": "decision", "kind": "approved", "digest": state.approval.digest}

        return self._decide(run_id, by, apply)

    def _check_affordable(self, state: RunState) -> None:
        """A held call its tenant cannot afford under a hard ceiling is not approved: the run
        would end `budget_exhausted` at once, the call never made (worker/client/_room.py)."""
        charges = call_charges(state, self.jobs.get(state.job))
        if state.pending is None or not charges:
            return
        ledger = self.ledger.read(state.tenant)
        why = no_room(state.tenant, state.pending.call.name, charges, ledger)
        if why is not None:
            raise DecisionRefusedError(f"cannot approve run {state.run_id}: {why}")

    def deny(self, run_id: str, *, by: str, reason: str) -> RunState:
        """Deny the call a suspended run holds: the run ends `approval_denied`, or, for a job
        that shows denials to its model, goes on with the denial as the call's result. Denying
        a run held `needs_budget` stops it `budget_exhausted`, naming the dimension."""

        def apply(state: RunState) -> dict[str, Any]:
            held = state.held_budget
            kernel_deny(state, self.jobs.get(state.job), by=by, at=now_iso(), reason=reason)
            event: dict[str, Any] = {"type": "decision", "kind": "denied", "reason": reason}
            if held is not None:  # a budget hold: the run ends budget_exhausted
                event.update(digest=held.digest, dimensions=held.dimensions)
            return event

        return self._decide(run_id, by, apply)

    def cancel(self, run_id: str, *, by: str, reason: str = "cancelled by an operator") -> str:
        """Cancelled at once ("cancelled") unless a turn of the run is in flight; then
        "requested": the run is cancelled at its next turn boundary. Both go through the
        store's version compare-and-set, so a cancel never lands on a run that moved on."""
        for _ in range(CANCEL_TRIES):
            tenant, stored = self.run_hash(run_id)
            status = stored["status"]
            if status == Status.STOPPED.value:
                raise DecisionRefusedError(
                    f"cannot cancel run {run_id}: it already ended {stored.get('outcome')}"
                )

            def apply(state: RunState) -> dict[str, Any]:
                kernel_cancel(state, by=by, at=now_iso(), reason=reason)
                return {"type": "decision", "kind": "cancelled", "reason": reason}

            try:
                self._decide(run_id, by, apply, if_idle=True)
                return "cancelled"
            except DecisionRefusedError:
                pass  # a turn is in flight, or the run moved on: look again
            if status == Status.RUNNING.value and stored.get("cancel_by"):
                return "requested"  # asked before; the step at the boundary will see it
            if status == Status.RUNNING.value:
                marked = self.store.mark(
                    tenant, run_id, version=int(stored["version"]), status=status,
                    fields={"cancel_by": by, "cancel_reason": reason},
                    event={"type": "cancel_requested", "by": by, "reason": reason,
                           "at": now_iso()},
                )  # fmt: skip
                if marked.kind == "ok":
                    return "requested"
        raise DecisionRefusedError(f"run {run_id} kept changing while cancelling; try again")


def connect_client(config: Settings) -> Client:
    """A client over the configured store, sending steps through the configured broker."""
    if config.redis_url is None:
        raise StoreUnavailable("no store: set TURNSTILE_REDIS_URL")
    return Client(connect(config.redis_url, config), config, sender(config))
