"""The test package outside the project's code is found by its entry point, and its run of
plain-value tools completes in process, the raise shown to the model as `tool_raised`."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixture_dist import FIXTURES, install
from turnstile.jobs.clock import SimClock
from turnstile.jobs.kernel import Finished, Runtime, run
from turnstile.jobs.runs import new_run
from turnstile.jobs.trace import Trace
from turnstile.worker.registry import Registry


def test_the_orders_package_registers_by_entry_point_and_its_run_completes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Installed as a distribution record on the path, `orders` is an entry-point job; its
    tools' dict, text and list reach the model, which answers from them; the raising tool is
    an observation, not a crash."""
    for entry in reversed(install(FIXTURES / "orders_agent", tmp_path / "site")):
        monkeypatch.syspath_prepend(entry)
    registry = Registry(None, spec="")
    (plugin,) = [p for p in registry.plugins if p.name == "orders"]
    assert plugin.source == "entry point orders = turnstile_orders:orders"
    job = registry.get("orders")
    state = new_run(run_id="r1", tenant="t", user_id="u", job=job, goal="where is it?",
                    params={"order_id": "A-1"})  # fmt: skip
    clock = SimClock()
    rt = Runtime(job=job, model=job.own_model(state.params), clock=clock, trace=Trace(clock))
    move = run(state, rt)
    rt.close()
    assert isinstance(move, Finished) and move.outcome.value == "completed"
    assert state.answer == (
        "Order A-1 is shipped: parcel for A-1 is in transit, arriving Tuesday. 2 returns. "
        "Stock unknown (tool_raised)."
    )
    assert state.facts == {"status": "shipped", "sku": "SKU-7"}
    assert isinstance(state.last_result, list)
    assert state.last_result[2] == {
        "call": 3, "tool": "check_stock", "status": "error", "code": "tool_raised",
        "detail": "RuntimeError: orders database is on fire",
    }  # fmt: skip
