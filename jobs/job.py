"""A job: the tools, policy, guardrail, view and model factory that one kind of run uses."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property
from typing import Any, cast

import msgspec
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from turnstile.jobs.budget import LEDGER_FIELDS, Budget
from turnstile.jobs.conversations import (
    FOLLOWUPS_KEY,
    ConversationPolicy,
    policy_problem,
    with_followups,
)
from turnstile.jobs.errors import JobDefinitionError, ParamsError
from turnstile.jobs.extensions import check_extendable
from turnstile.jobs.mcp import McpServer, check_servers
from turnstile.jobs.model import (
    Model,
    ToolSpec,
    definition_tokens,
    is_model,
    is_provider_model,
    spec_problem,
)
from turnstile.jobs.state import Call, RunState
from turnstile.jobs.tools import Tool
from turnstile.jobs.versions import (
    Migration,
    NoPath,
    check_migrations,
    derived,
    fingerprint,
    version_problem,
)


class Permit(StrEnum):
    """A policy's decision on one call: run it, refuse it, or hold it for a person."""

    ALLOW = "allow"
    DENY = "deny"
    ASK = "ask"


@dataclass(frozen=True)
class Verdict:
    """What a job's policy says of one call: the decision, why (shown to the model or the
    approver), and the rule that decided (`GRANT_RULE` lets an irreversible write run)."""

    decision: Permit
    reason: str = ""
    rule: str = "default"


GRANT_RULE = "job.grant"  # a job's explicit allowance: the only thing that lets an
#                           irreversible write run without asking a person


class Severity(StrEnum):
    """How hard a guardrail stops a call: block it alone, or halt the whole run."""

    BLOCK = "block"  # refuse this call, tell the model why
    HALT = "halt"  # stop the run: guardrail_stop


@dataclass(frozen=True)
class Guard:
    """A guardrail's finding on one call: its severity and the detail the run records."""

    severity: Severity
    detail: str


PolicyFn = Callable[[Call, Tool, RunState], Verdict]
GuardFn = Callable[[Call, RunState], Guard | None]


def allow_all(call: Call, tool: Tool, state: RunState) -> Verdict:
    return Verdict(Permit.ALLOW)


def no_guard(call: Call, state: RunState) -> Guard | None:
    return None


def tighten(verdict: Verdict, tool: Tool) -> Verdict:
    """A tool's risk may only tighten a verdict: an irreversible write asks a person unless the
    job granted it explicitly."""
    if (
        verdict.decision is Permit.ALLOW
        and tool.mutates
        and not tool.reversible
        and verdict.rule != GRANT_RULE
    ):
        return Verdict(Permit.ASK, "irreversible action", "tool.irreversible")
    return verdict


def render_view(state: RunState) -> str:
    """What the model is shown: goal, plan with statuses, facts, last result and the budget it
    has left. Never the transcript. Recalled notes appear, labelled, only when there are any."""
    view: dict[str, Any] = {
        "goal": state.goal,
        "plan": [
            {"id": s.id, "tool": s.tool, "depends_on": s.depends_on, "status": s.status}
            for s in state.plan
        ],
        "facts": state.facts,
        "last_result": state.last_result,
        "remaining": {
            "steps": state.budget.max_steps - state.usage.steps,
            "tool_calls": state.budget.max_tool_calls - state.usage.tool_calls,
            "tokens": state.budget.max_tokens - state.usage.tokens,
        },
    }
    if state.memory:
        view["remembered_notes"] = state.memory
    if state.followups:  # the user wrote again while the run was active (a conversation)
        view[FOLLOWUPS_KEY] = [f.text for f in state.followups]
    return _VIEW_JSON.encode(view)


_VIEW_JSON = json.JSONEncoder(sort_keys=True)  # json.dumps(view, sort_keys=True), made once


def _no_params_check(params: Mapping[str, Any]) -> None:
    return None


NO_PARAMS: Mapping[str, Any] = {"type": "object", "properties": {}, "additionalProperties": False}
JOB_NAME = re.compile(r"[a-z][a-z0-9_.\-]{0,63}")


@dataclass(frozen=True)
class Example:
    """A run the job's demo submits (`turnstile demo --job NAME`)."""

    label: str
    goal: str
    params: Mapping[str, Any] = field(default_factory=dict)
    budget: Budget | None = None


ModelFactory = Callable[[Mapping[str, Any]], Model]
# A job's default model: a model string (`openai:gpt-4.1-mini`, `local:llama3`), a Model used
# by every run (a scripted one), or a factory building one from the run's params.
ModelChoice = str | Model | ModelFactory
# Run parameters every job takes, whatever its params schema: a model string for the run's
# model and for its fallback, overriding the job's own.
RUN_MODEL_PARAMS = ("model", "fallback_model")


@dataclass(frozen=True, eq=False)
class Job:
    """One kind of run: its name, tools, model factory (`model(params)`), default budget,
    policy (`policy(call, tool, state) -> Verdict`), guardrail (`guardrail(call, state) ->
    Guard | None`), the view the model is shown (`render`), its params' JSON Schema, its own
    ledger dimensions and the example runs its demo submits. Checked when made: a mistake
    is a JobDefinitionError. Registered as a plugin (entry point `turnstile.jobs`, or
    TURNSTILE_JOBS), never edited into Turnstile.

    `model` is the run's model unless the run's `model` parameter names another
    (`provider:model`); `fallback_model` is asked when the first keeps failing (rate limits,
    5xx) past its retries, unless the run's `fallback_model` parameter names another."""

    name: str
    tools: Mapping[str, Tool]
    model: ModelChoice
    budget: Budget = field(default_factory=Budget)
    render: Callable[[RunState], str] = render_view
    policy: PolicyFn = allow_all
    guardrail: GuardFn = no_guard
    deny_as_observation: bool = False  # a denial is shown to the model instead of ending
    check_params: Callable[[Mapping[str, Any]], None] = _no_params_check  # beyond the schema
    description: str = ""
    # JSON Schema (2020-12) of the run's params: unknown keys, wrong types and values out of
    # range are refused at submit, before anything is written.
    params_schema: Mapping[str, Any] = field(default_factory=lambda: dict(NO_PARAMS))
    # Ledger dimensions of the job's own (e.g. refund_cents), charged by its tools
    # (Tool.charges) and capped per tenant like the built-in four.
    dimensions: tuple[str, ...] = ()
    drill_params: tuple[str, ...] = ()  # act on the worker process only; replay drops them
    shared_params: tuple[str, ...] = ()  # make runs share a world; replay refuses them
    examples: tuple[Example, ...] = ()
    fallback_model: str | None = None
    # What a submission to a conversation with an active run does when it names no policy
    # (jobs/conversations.py): `reject` unless the job says otherwise.
    conversation_policy: ConversationPolicy = ConversationPolicy.REJECT
    # Budget dimensions (steps, tool_calls, tokens, cost, deadline) whose running out suspends
    # a run `needs_budget`, for a person to extend or stop, instead of ending it.
    extendable: tuple[str, ...] = ()
    # MCP servers whose tools the model is offered besides `tools` (jobs/mcp.py): declared
    # here, connected by the worker; nothing a run carries chooses one.
    mcp: Sequence[McpServer] = ()
    # The job's version (jobs/versions.py): declared, or derived from its tools, params schema
    # and state format when left empty. Each run is pinned to the version that created it.
    version: str = ""
    # Migrations of a run's state from named earlier versions to this one, run at the run's
    # next turn boundary; empty: runs are pinned (they finish on the version they began on).
    migrate: Mapping[str, Migration] = field(default_factory=dict)
    # A run of a version this job neither serves nor migrates, when it migrates others: it
    # waits for a worker of its version, or ends.
    no_path: NoPath = NoPath.WAIT
    fingerprint: str = field(init=False, default="")
    _params_validator: Draft202012Validator = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not JOB_NAME.fullmatch(self.name):
            raise JobDefinitionError(
                f"job name {self.name!r}: lower-case letters, digits, '.', '_', '-', at most 64"
            )
        self._check_models()
        problem = policy_problem(self.conversation_policy)
        if problem:
            raise JobDefinitionError(f"job {self.name!r}: {problem}")
        object.__setattr__(
            self, "conversation_policy", ConversationPolicy(self.conversation_policy)
        )
        object.__setattr__(
            self, "extendable", check_extendable(self.extendable, f"job {self.name!r}")
        )
        object.__setattr__(self, "mcp", check_servers(self.name, self.mcp))
        for key, tool in self.tools.items():
            if not isinstance(tool, Tool) or tool.name != key:
                raise JobDefinitionError(f"job {self.name!r}: {key!r} is not a Tool of that name")
            undeclared = sorted(set(tool.charges) - set(self.dimensions))
            if undeclared:
                raise JobDefinitionError(
                    f"job {self.name!r}: tool {key!r} charges undeclared dimensions {undeclared}"
                )
        for dimension in self.dimensions:
            if dimension in LEDGER_FIELDS or not re.fullmatch(r"[a-z][a-z0-9_]{0,63}", dimension):
                raise JobDefinitionError(
                    f"job {self.name!r}: bad dimension {dimension!r} (lower-case, digits and _, "
                    f"not one of {', '.join(LEDGER_FIELDS)})"
                )
        try:
            Draft202012Validator.check_schema(self.params_schema)
        except SchemaError as exc:
            raise JobDefinitionError(
                f"job {self.name!r}: its params schema is not valid JSON Schema: {exc.message}"
            ) from exc
        if self.params_schema.get("type") != "object":
            raise JobDefinitionError(f"job {self.name!r}: its params schema must be an object")
        object.__setattr__(
            self, "_params_validator", Draft202012Validator(msgspec.to_builtins(self.params_schema))
        )
        self._check_version()

    def _check_version(self) -> None:
        print_ = fingerprint(self.tools, self.params_schema, tuple(s.name for s in self.mcp))
        object.__setattr__(self, "fingerprint", print_)
        if self.version == "":
            object.__setattr__(self, "version", derived(print_))
        else:
            problem = version_problem(self.version)
            if problem:
                raise JobDefinitionError(f"job {self.name!r}: {problem}")
        problem = check_migrations(self.name, self.migrate)
        if problem:
            raise JobDefinitionError(problem)
        if self.version in self.migrate:
            raise JobDefinitionError(
                f"job {self.name!r}: migrate names its own version {self.version!r}"
            )
        try:
            object.__setattr__(self, "no_path", NoPath(self.no_path))
        except ValueError:
            raise JobDefinitionError(
                f"job {self.name!r}: no_path must be 'wait' or 'end', not {self.no_path!r}"
            ) from None

    def _check_models(self) -> None:
        model = self.model
        if isinstance(model, str):
            problem = spec_problem(model)
            if problem:
                raise JobDefinitionError(f"job {self.name!r}: model {problem}")
        elif not (is_model(model) or callable(model)):
            raise JobDefinitionError(
                f"job {self.name!r}: model must be a model string (provider:model), a Model "
                f"(an object with next(request)) or a factory of one, not {type(model).__name__}"
            )
        if self.fallback_model is not None:
            problem = spec_problem(self.fallback_model)
            if problem:
                raise JobDefinitionError(f"job {self.name!r}: fallback_model {problem}")

    @property
    def _model_factory(self) -> bool:
        return not isinstance(self.model, str) and not is_model(self.model)

    def _own_params(self) -> Mapping[str, Any]:
        properties = self.params_schema.get("properties")
        return properties if isinstance(properties, Mapping) else {}

    def _run_model_params(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """The run-model params (`model`, `fallback_model`) this job leaves to Turnstile:
        checked for their form here; the rest of the params go to the job's schema. A `model`
        that is not a model string is the job's own (a stand-in's name for its factory), and
        only a job that builds its model from the params and declares `model` can take one."""
        own = self._own_params()
        taken: dict[str, Any] = {}
        for name in RUN_MODEL_PARAMS:
            if name not in params:
                continue
            value = params[name]
            if name in own and self._model_factory and not is_provider_model(value):
                continue  # the job's own stand-in: its schema and its check say
            problem = spec_problem(value)
            if problem:
                raise ParamsError(f"params.{name}: {problem}")
            taken[name] = value
        return taken

    def model_spec(self, params: Mapping[str, Any]) -> str | None:
        """The model string the run's model is built from: its `model` parameter when that
        names one, else the job's own when it is a string; None for a job's stand-in."""
        chosen = params.get("model")
        if is_provider_model(chosen):
            return str(chosen)
        return self.model if isinstance(self.model, str) else None

    def fallback_spec(self, params: Mapping[str, Any]) -> str | None:
        """The model string of the run's fallback model, if it has one."""
        chosen = params.get("fallback_model")
        return str(chosen) if is_provider_model(chosen) else self.fallback_model

    def own_model(self, params: Mapping[str, Any]) -> Model:
        """The run's model when it names no model string: the job's Model, or the one its
        factory builds from the params (a factory may read a `model` string itself). A factory
        returning something else is a TypeError saying so."""
        if isinstance(self.model, str):
            raise ParamsError(f"job {self.name!r} runs on {self.model}: a provider builds it")
        if is_model(self.model):
            return cast(Model, self.model)
        factory = cast(ModelFactory, self.model)
        built = factory(params)
        if not is_model(built):
            raise TypeError(
                f"the model factory of job {self.name!r} returned {type(built).__name__}, "
                "not a Model (an object with next(request))"
            )
        return built

    def validate_params(self, params: Mapping[str, Any]) -> None:
        """Raise ParamsError naming the first bad key: unknown, mistyped or out of range."""
        taken = self._run_model_params(params)
        errors = sorted(  # an unknown key first: a typo also makes its right name missing
            self._params_validator.iter_errors(
                {k: v for k, v in params.items() if k not in taken}
            ),
            key=lambda e: (e.validator != "additionalProperties", list(map(str, e.absolute_path)),
                           e.message),
        )  # fmt: skip
        if errors:
            raise ParamsError(_params_message(self, errors[0]))
        self.check_params(params)

    def view(self, state: RunState) -> str:
        """What the model is shown: the job's `render`, with the user's follow-ups (messages
        merged into the run by its conversation) whether or not the render shows them."""
        return with_followups(self.render(state), state)

    @cached_property
    def tool_specs(self) -> tuple[ToolSpec, ...]:
        """The tools as a model is told about them, made once per job (as its tools are)."""
        return tuple(ToolSpec(t.name, t.description, t.schema) for t in self.tools.values())

    @cached_property
    def definition_tokens(self) -> int:
        """The tools as a provider's function definitions, estimated once per job: what every
        provider request carries (jobs/model.py `provider_overhead_tokens`)."""
        return definition_tokens(self.tools.values())

    @cached_property
    def tool_cost_bound_microusd(self) -> int:
        """The most one call of this job can cost: what a per-turn allowance reserves."""
        bounds = [t.cost_bound_microusd for t in self.tools.values()]
        return max([*bounds, *(s.cost_bound_microusd for s in self.mcp)], default=0)


def _params_message(job: Job, exc: Any) -> str:
    """One line naming the key: `params.amount_cent: unknown key (known: ...)`."""
    where = ".".join(str(p) for p in exc.absolute_path)
    if exc.validator == "additionalProperties":
        known = sorted(exc.schema.get("properties", {}))
        extra = sorted(set(exc.instance) - set(exc.schema.get("properties", {})))
        place = f"params.{where}." if where else "params."
        return (
            f"{place}{extra[0] if extra else '?'}: unknown key for job {job.name!r} "
            f"(known: {', '.join(known) or 'none'})"
        )
    if exc.validator == "required" and isinstance(exc.instance, Mapping):
        missing = next((k for k in exc.validator_value if k not in exc.instance), "?")
        return f"params.{where + '.' if where else ''}{missing}: required by job {job.name!r}"
    return f"params.{where or '(all)'}: {exc.message}"[:300]
