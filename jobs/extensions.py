"""Budgets a person can extend: the hold a run out of an extendable dimension suspends with,
and the checks an extension passes before it changes the run's limits. Pure, integers only.

A job (`Job.extendable`) or its tenant names the dimensions (steps, tool_calls, tokens, cost,
deadline: the names `budget_exhausted` gives; `tenant.<dimension>` for a soft ceiling of the
tenant's ledger) whose running out suspends the run `needs_budget` instead of ending it. The
hold says, per amount (steps, tool_calls, tokens, cost_microusd, deadline_ms, or
tenant.<dimension>), what was spent, what the next turn needs, the limits and a suggested
extension; a person approves new limits with its digest, or stops the run.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping

import msgspec

from turnstile.jobs.budget import Budget, Usage, admission_rows
from turnstile.jobs.errors import DecisionError, JobDefinitionError
from turnstile.jobs.outcomes import Resource
from turnstile.jobs.state import HeldBudget, RunState

MAX_LIMIT = 2**53  # the ledger's largest amount: a limit above it could never be reserved

# Each dimension's amount as a hold and an extension name it (with its unit), and the Budget
# field that caps it.
AMOUNTS: dict[Resource, tuple[str, str]] = {
    Resource.STEPS: ("steps", "max_steps"),
    Resource.TOOL_CALLS: ("tool_calls", "max_tool_calls"),
    Resource.DEADLINE: ("deadline_ms", "deadline_ms"),
    Resource.TOKENS: ("tokens", "max_tokens"),
    Resource.COST: ("cost_microusd", "max_cost_microusd"),
}
EXTENDABLE = tuple(r.value for r in AMOUNTS)  # what `extendable` may name
AMOUNT_NAMES = tuple(name for name, _ in AMOUNTS.values())  # what an extension may set
LIMIT_FIELD = dict(AMOUNTS.values())  # amount name -> Budget field
TENANT = "tenant."  # a soft ceiling of the tenant's ledger: tenant.<dimension>
_TENANT_NAME = re.compile(r"tenant\.[a-z][a-z0-9_]{0,63}")


def is_tenant(name: object) -> bool:
    """Whether `name` names a ledger dimension of the tenant's (`tenant.tokens`)."""
    return isinstance(name, str) and _TENANT_NAME.fullmatch(name) is not None


def check_extendable(names: Iterable[object], where: str) -> tuple[str, ...]:
    """The names as a sorted tuple; a name that is no dimension is refused, naming them."""
    if isinstance(names, str):
        raise JobDefinitionError(f"{where}: extendable must be a tuple of names, e.g. ('tokens',)")
    out = []
    for name in names:
        if name not in EXTENDABLE and not is_tenant(name):
            raise JobDefinitionError(
                f"{where}: {name!r} is not a budget dimension; one of {', '.join(EXTENDABLE)}, "
                "or tenant.<dimension> for a soft ceiling of the tenant's"
            )
        out.append(str(name))
    return tuple(sorted(set(out)))


def _digest(state: RunState, dimensions: list[str]) -> str:
    """What an extension is bound to: this run, out of these dimensions at this usage."""
    canonical = msgspec.json.encode(
        ["budget", state.run_id, dimensions, state.usage, state.budget], order="sorted"
    )
    return hashlib.sha256(canonical).hexdigest()[:16]


def suggest(spent: int, needed: int, limit: int) -> int:
    """The suggested new limit: room for the next turn, and half the current limit again."""
    return min(MAX_LIMIT, spent + needed + max(1, limit // 2))


def hold_for(state: RunState, reserve: Usage, reason: str) -> HeldBudget | None:
    """The hold a run suspends with when `reserve` does not fit its budget, or None when it
    fits, or when a dimension it does not fit is not extendable (the run ends instead)."""
    spent, needed, limits, unfit = {}, {}, {}, []
    for resource, used, held, ceiling, fits in admission_rows(
        consumed=state.usage, reserve=reserve, budget=state.budget
    ):
        name = AMOUNTS[resource][0]
        spent[name], needed[name], limits[name] = used, held, ceiling
        if not fits:
            unfit.append(resource)
    if not unfit or any(r.value not in state.extendable for r in unfit):
        return None
    dimensions = [r.value for r in unfit]
    suggested = {
        AMOUNTS[r][0]: suggest(spent[AMOUNTS[r][0]], needed[AMOUNTS[r][0]], limits[AMOUNTS[r][0]])
        for r in unfit
    }
    return HeldBudget(
        dimensions=dimensions, spent=spent, needed=needed, limits=limits, suggested=suggested,
        digest=_digest(state, dimensions), reason=reason,
    )  # fmt: skip


def tenant_hold(
    state: RunState, rows: Mapping[str, tuple[int, int, int]], reason: str
) -> HeldBudget:
    """The hold of a run whose next turn would take the tenant past soft ceilings it made
    extendable: per `tenant.<dimension>`, (what the tenant has spent and holds, what the turn
    needs, the ceiling)."""
    names = sorted(rows)
    spent = {n: rows[n][0] for n in names}
    needed = {n: rows[n][1] for n in names}
    limits = {n: rows[n][2] for n in names}
    suggested = {n: suggest(spent[n], needed[n], limits[n]) for n in names}
    canonical = msgspec.json.encode(["budget", state.run_id, names, state.usage, rows])
    return HeldBudget(
        dimensions=names, spent=spent, needed=needed, limits=limits, suggested=suggested,
        digest=hashlib.sha256(canonical).hexdigest()[:16], reason=reason,
    )  # fmt: skip


def parse_limits(pairs: Iterable[str]) -> dict[str, int]:
    """`tokens=50000 cost_microusd=2000000` (a command line's form) as limits; each pair is
    checked for its form here, and for its value by `extended_budget`."""
    out: dict[str, int] = {}
    for pair in pairs:
        name, sep, raw = pair.partition("=")
        if not sep or (name not in AMOUNT_NAMES and not is_tenant(name)):
            raise DecisionError(
                f"bad extension {pair!r}: expected NAME=LIMIT, NAME one of "
                + ", ".join(AMOUNT_NAMES)
                + " or tenant.<dimension>"
            )
        if not raw.isdigit():
            raise DecisionError(f"bad extension {pair!r}: the limit must be a whole number")
        out[name] = int(raw)
    return out


def extended_budget(state: RunState, limits: Mapping[str, object]) -> tuple[Budget, dict[str, int]]:
    """The run's budget with `limits` (amount name -> new limit) applied, and the limits as
    checked: known names, whole numbers, none below the run's limit, and the held dimensions
    given room for the next turn. A DecisionError names the first that is not."""
    held = state.held_budget
    assert held is not None
    if not limits:
        raise DecisionError("an extension names at least one new limit")
    checked: dict[str, int] = {}
    for name, value in limits.items():
        held_here = name in held.dimensions
        if name not in LIMIT_FIELD and not (is_tenant(name) and held_here):
            raise DecisionError(
                f"cannot extend {name!r}: one of {', '.join(AMOUNT_NAMES)} may be extended, "
                "or a soft ceiling of the tenant's that holds the run"
            )
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_LIMIT:
            raise DecisionError(f"{name} must be a whole number in 0..2^53, not {value!r}")
        if is_tenant(name):
            current = held.limits[name]
            if value < held.spent[name] + held.needed[name]:
                raise DecisionError(
                    f"{name}={value} leaves no room for the next turn: it needs at least "
                    f"{held.spent[name] + held.needed[name]}"
                )
        else:
            current = int(getattr(state.budget, LIMIT_FIELD[name]))
        if value < current:
            raise DecisionError(
                f"{name}={value} is below the run's limit of {current}: an extension only raises"
            )
        checked[name] = value
    budget = msgspec.structs.replace(
        state.budget, **{LIMIT_FIELD[n]: v for n, v in checked.items() if n in LIMIT_FIELD}
    )
    for dimension in held.dimensions:
        if is_tenant(dimension):
            if dimension not in checked:
                raise DecisionError(f"the run is held by {dimension}: give {dimension}=LIMIT")
            continue
        name = AMOUNTS[Resource(dimension)][0]
        limit = int(getattr(budget, LIMIT_FIELD[name]))
        room = held.spent[name] + held.needed[name]
        short = limit <= held.spent[name] if name == "deadline_ms" else limit < room
        if short:
            want = held.spent[name] + 1 if name == "deadline_ms" else room
            raise DecisionError(
                f"{name}={limit} leaves no room for the next turn: it needs at least {want}"
            )
    return budget, checked
