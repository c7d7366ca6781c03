"""Whether a held call's tenant can afford it: what the call charges the tenant's ledger when it
runs (its job dimensions' bounds for its arguments, and its cost bound), against the room each
hard ceiling has left. An approval of a call the tenant cannot afford is refused before
anything is written (approved, its run would end `budget_exhausted` at once, the call never
made), and a view of the held call says so beside it, so a person sees it before deciding."""

from __future__ import annotations

from collections.abc import Mapping

from turnstile.jobs.job import Job
from turnstile.jobs.state import RunState
from turnstile.ledger.results import DimensionState

COST = "cost_microusd"


def call_charges(state: RunState, job: Job) -> dict[str, int]:
    """What the run's held call charges its tenant when it runs, by ledger dimension (none
    for a run that holds no call, or a tool its job no longer has)."""
    held = state.pending
    tool = job.tools.get(held.call.name) if held is not None else None
    if held is None or tool is None:
        return {}
    out = {d: v for d, v in tool.charge_bounds(held.call.args).items() if v > 0}
    if tool.cost_bound_microusd > 0:
        out[COST] = out.get(COST, 0) + tool.cost_bound_microusd
    return out


def no_room(
    tenant: str, tool: str, charges: Mapping[str, int], ledger: Mapping[str, DimensionState]
) -> str | None:
    """Why the tenant cannot afford the call now, in one sentence naming what to do: the first
    dimension it charges whose hard ceiling has less left than the charge. None when each
    fits (a soft ceiling never refuses: it only reports, or holds the run for an extension)."""
    for dimension, amount in sorted(charges.items()):
        row = ledger.get(dimension)
        if row is None or not row.hard or row.ceiling is None:
            continue
        left = max(0, row.ceiling - row.committed - row.reserved)
        if amount > left:
            return (
                f"the held call {tool} charges {amount} {dimension} and tenant {tenant!r} has "
                f"{left} left under its hard {dimension} ceiling of {row.ceiling}: raise it "
                f"(turnstile ledger set {tenant} {dimension}=N) or deny the call"
            )
    return None
