"""Job-declared ledger dimensions: a tool's charge bound is reserved before it runs, the
actual is what the run is charged, and a refusal names tenant.<dimension>."""

from __future__ import annotations

import socket
from typing import Any

import msgspec
import pytest
import redis
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.kit import Listed
from turnstile.jobs.budget import Usage
from turnstile.jobs.calls import call_key
from turnstile.jobs.clock import SimClock
from turnstile.jobs.declare import tool
from turnstile.jobs.job import GRANT_RULE, Job, Permit, Verdict
from turnstile.jobs.kernel import Finished, Runtime, exposure, turn
from turnstile.jobs.outcomes import Outcome
from turnstile.jobs.runs import new_run
from turnstile.jobs.state import Call, HeldCall, RunState
from turnstile.jobs.tools import Tool, ToolContext, ToolOutput
from turnstile.jobs.trace import Trace
from turnstile.ledger.client import Ledger
from turnstile.ledger.inputs import DEFAULT_DIMENSIONS
from turnstile.worker.broker.message import StepMessage
from turnstile.worker.runtime.holds import LedgerDown, LedgerGate, split_actual
from turnstile.worker.store.runs import RunStore

REFUNDED: list[int] = []


@tool(mutates=True, reversible=False, charges={"refund_cents": "amount_cents"}, key_args=("order",))
def refund(ctx: ToolContext, order: str, amount_cents: int) -> ToolOutput:
    """Refund part of an order."""
    REFUNDED.append(amount_cents)
    return ToolOutput({"status": "ok"}, 0.1, charges={"refund_cents": amount_cents - 200})


def grant(call: Call, tool: Tool, state: RunState) -> Verdict:
    return Verdict(Permit.ALLOW, "granted", GRANT_RULE)


def job() -> Job:
    return Job(name="refunds", tools={"refund": refund}, model=lambda p: Listed([]),
               dimensions=("refund_cents",), policy=grant)  # fmt: skip


class Gate:
    def __init__(self, admit: bool) -> None:
        self.admit, self.asked = admit, list[Usage]()
        self.rejected: str | None = None if admit else "refund_cents"

    def extend(self, extra: Usage) -> bool:
        self.asked.append(extra)
        return self.admit


def one_turn(admit: bool, reply: dict[str, Any]) -> tuple[RunState, Gate, Any]:
    REFUNDED.clear()
    state = new_run(run_id="r1", tenant="t", user_id="u", job=job(), goal="refund")
    gate = Gate(admit)
    rt = Runtime(job=job(), model=Listed([reply]), clock=SimClock(), trace=Trace(SimClock()),
                 gate=gate)  # fmt: skip
    move = turn(state, rt)
    rt.close()
    return state, gate, move


REFUND = {"type": "tool", "name": "refund", "args": {"order": "o1", "amount_cents": 700}}


def test_a_charging_call_reserves_its_bound_and_is_charged_the_actual() -> None:
    """The gate is asked for the call's bound (its amount_cents) before the call; the run's
    usage then carries the actual the tool reported."""
    state, gate, _ = one_turn(True, REFUND)
    assert gate.asked == [Usage(extra={"refund_cents": 700})]
    assert REFUNDED == [700]
    assert state.usage.extra == {"refund_cents": 500}
    assert state.usage.ledger_amounts()["refund_cents"] == 500


def test_a_refused_dimension_ends_the_run_naming_it_and_nothing_runs() -> None:
    """The tenant's ledger refusing refund_cents ends the run budget_exhausted with detail
    tenant.refund_cents; the refund never runs."""
    state, _, move = one_turn(False, REFUND)
    assert isinstance(move, Finished) and move.outcome is Outcome.BUDGET_EXHAUSTED
    assert state.detail == "tenant.refund_cents"
    assert REFUNDED == [] and state.usage.extra == {}


def test_a_held_call_that_will_run_next_is_in_the_turns_exposure() -> None:
    """An approved held refund is part of the next turn's hold, at its bound."""
    state = new_run(run_id="r1", tenant="t", user_id="u", job=job(), goal="refund")
    call = Call(name="refund", args={"order": "o1", "amount_cents": 900})
    state.pending = HeldCall(call=call, key="k", digest="d", reason="asked")
    _, worst = exposure(state, job())
    assert worst.extra == {"refund_cents": 900}


def test_settlement_gives_a_job_dimension_to_the_hold_that_reserved_it() -> None:
    """split_actual shares each dimension by what each hold reserved; the last takes the rest."""
    turn_hold = Usage(steps=1, tool_calls=1, tokens=100)
    gate_hold = Usage(extra={"refund_cents": 700})
    actual = Usage(steps=1, tool_calls=1, tokens=80, extra={"refund_cents": 500})
    shares = split_actual(actual, [("a", turn_hold), ("b", gate_hold)])
    assert shares[0][1].extra == {} and shares[0][1].tokens == 80
    assert shares[1][1].extra == {"refund_cents": 500}


_amount = st.integers(min_value=0, max_value=50)
_usage = st.builds(
    Usage, steps=_amount, tool_calls=_amount, tokens=_amount, cost_microusd=_amount,
    extra=st.dictionaries(st.sampled_from(["refund_cents", "emails"]), _amount, max_size=2),
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(actual=_usage, held=st.lists(_usage, min_size=1, max_size=3))
def test_shares_add_up_to_the_actual_and_only_the_last_passes_its_hold(
    actual: Usage, held: list[Usage]
) -> None:
    """Each hold but the last takes up to what it reserved, in order; the last takes the rest,
    so the shares always add up to the actual usage, dimension by dimension."""
    shares = split_actual(actual, [(f"h{i}", h) for i, h in enumerate(held)])
    assert [rid for rid, _ in shares] == [f"h{i}" for i in range(len(held))]
    total = sum((share for _, share in shares), Usage())

    def nonzero(usage: Usage) -> dict[str, int]:
        return {k: v for k, v in usage.ledger_amounts().items() if v}

    assert nonzero(total) == nonzero(actual)
    left = actual.ledger_amounts()
    for (_, share), hold in zip(shares[:-1], held[:-1], strict=True):
        for dimension, amount in share.ledger_amounts().items():
            assert amount == min(left[dimension], hold.ledger_amounts().get(dimension, 0))
            left[dimension] -= amount


def test_the_key_of_a_tool_with_key_args_follows_those_arguments() -> None:
    """A tool naming key_args gets the same idempotency key for the same values."""
    state = new_run(run_id="r1", tenant="t", user_id="u", job=job(), goal="refund")

    def key(order: str, amount_cents: int, step: int, index: int) -> str:
        args = {"order": order, "amount_cents": amount_cents}
        return call_key(state, Call(name="refund", args=args), step=step, index=index, tool=refund)

    one, two, other = key("o1", 1, 1, 0), key("o1", 2, 5, 3), key("o2", 1, 1, 0)
    assert one == two != other


def test_a_copy_of_usage_does_not_move_with_the_original() -> None:
    """The step measures a turn as usage minus a shallow copy taken before it: charging a job
    dimension must not change that copy."""
    usage = Usage(extra={"refund_cents": 100})
    before = msgspec.structs.replace(usage)
    usage.charge({"refund_cents": 700})
    assert (usage - before).extra == {"refund_cents": 700}


def test_an_unreachable_ledger_mid_turn_is_retried_not_a_refusal() -> None:
    """The turn's gate facing a ledger that does not answer raises LedgerDown (the step is
    retried) instead of ending the run budget_exhausted."""
    nobody = socket.socket()
    nobody.bind(("127.0.0.1", 0))
    port = nobody.getsockname()[1]
    nobody.close()  # a port where no server listens
    known = (*DEFAULT_DIMENSIONS, "refund_cents")
    url = f"redis://127.0.0.1:{port}/0"
    store = RunStore(redis.Redis.from_url(url), Ledger.from_url(url, dimensions=known))
    gate = LedgerGate(store, StepMessage("t", "r1", 1, "default"), "r1:1:v1:x", timeout_s=5)
    with pytest.raises(LedgerDown):
        gate.extend(Usage(extra={"refund_cents": 700}))
