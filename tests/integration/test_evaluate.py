"""Evaluating recorded runs on variants: fifty recorded support runs re-run on two scripted
variants whose differences are known, the report's counts are those differences, no write is
executed (the shop's effects are what the originals left), and only the evaluation's tenant is
charged. An evaluation interrupted by a worker's SIGKILL resumes and evaluates each run once."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from typer.testing import CliRunner

from tests.integration.workers import (
    client_for,
    ended_once,
    running_workers,
    settled,
    shop_effects,
    wait_until,
)
from turnstile.jobs.outcomes import Outcome
from turnstile.jobs.support.scenarios import GOAL, USER
from turnstile.worker.cli.main import app
from turnstile.worker.client._client import Client
from turnstile.worker.ops import evaluate as evaluation
from turnstile.worker.ops.errors import ControlError, ForkRefusedError
from turnstile.worker.ops.fork import Variant
from turnstile.worker.ops.replay import replay_run
from turnstile.worker.store import keys

pytestmark = pytest.mark.integration

runner = CliRunner()
EFFECTS = [["refund", "ord_1001", 3000], ["email", "ord_1001"]]  # what each original did


@pytest.fixture(scope="module")
def queue(redis_url: str) -> Iterator[str]:
    """A queue of this module's, served by two workers (the SIGKILL drill has its own)."""
    name = f"eval-{uuid.uuid4().hex[:8]}"
    with running_workers(redis_url, [name], 2):
        yield name


def _originals(client: Client, tenant: str, queue: str, count: int) -> list[str]:
    runs = [
        client.submit(tenant, USER, "support", GOAL, {"model_latency_s": 0}, queue=queue,
                      budget={"max_repeat": 2})
        for _ in range(count)
    ]  # fmt: skip
    wait_until(lambda: settled(client, runs), timeout_s=180, what="the originals to end")
    assert {client.state(r).outcome for r in runs} == {Outcome.COMPLETED}
    return runs


def _ledger(client: Client, tenant: str) -> dict[str, Any]:
    return {d: (s.committed, s.reserved) for d, s in client.ledger.read(tenant).items()}


def _tokens_to(client: Client, tenant: str, run_id: str, turn: int) -> int:
    """The run's tokens after its `turn`-th turn, as its turn event recorded them."""
    events = [e for _, e in client.store.events(tenant, run_id) if e["type"] == "turn"]
    return int(events[turn - 1]["totals"]["tokens"])


def _done(client: Client, eval_id: str) -> dict[str, Any]:
    said: dict[str, Any] = {}

    def finished() -> bool:
        said.update(evaluation.report(client, eval_id))
        return bool(said["status"] == "done")

    wait_until(finished, timeout_s=240, what=f"evaluation {eval_id} to end")
    return said


@pytest.mark.parametrize(
    "count", [pytest.param(6, id="6 runs"), pytest.param(50, id="50 runs", marks=pytest.mark.slow)]
)
def test_recorded_runs_on_two_variants_report_the_known_differences_and_execute_no_write(
    redis_url: str, queue: str, count: int
) -> None:
    """Fifty recorded runs (six in the fast suite). Variant A (refund 5000 cents,
    replay-reads): the same plan, read and email come from the recording, the refund is not in
    it and is held: every run completes, diverging at turn 3 with one held write. Variant B
    (the same_call model, stop-on-divergence): its first call is not in the recording, so
    every run ends `diverged` at turn 1. A third, from turn 3, completes without diverging.
    The shop holds what the originals did and nothing more; the originals' tenant is not
    charged, the evaluation's is, for its own turns only."""
    tenant, judge = (f"{p}-{uuid.uuid4().hex[:8]}" for p in ("t", "ev"))
    client = client_for(redis_url)
    originals = _originals(client, tenant, queue, count)
    before = _ledger(client, tenant)
    a = evaluation.start(
        client, evaluation.Selection(tenant=tenant, job="support"),
        Variant(params={"amount_cents": 5000}), mode="replay-reads", eval_tenant=judge,
        queue=queue,
    )  # fmt: skip
    said = runner.invoke(app, [
        "eval", "start", "--tenant", tenant, "--outcome", "completed", "--since", "1h",
        "--variant", "model=same_call", "--mode", "stop-on-divergence",
        "--eval-tenant", judge, "--queue", queue, "--redis-url", redis_url,
    ])  # fmt: skip
    assert said.exit_code == 0, said.output
    b_id = said.output.strip()
    c = evaluation.start(
        client, evaluation.Selection(tenant=tenant), Variant(params={"amount_cents": 5000}),
        mode="stop-on-divergence", eval_tenant=judge, from_turn=3, queue=queue,
    )  # fmt: skip
    report_a, report_b = _done(client, a.eval_id), _done(client, b_id)
    report_c = _done(client, c.eval_id)
    totals_a, totals_b = report_a["totals"], report_b["totals"]
    assert (totals_a["runs"], totals_a["evaluated"]) == (count, count)
    assert totals_a["outcomes_changed"] == 0
    assert totals_a["variant"]["outcomes"] == {"completed": count}
    assert totals_a["held_writes"] == count
    assert {r["first_divergent_turn"] for r in report_a["runs"]} == {3}
    assert totals_a["variant"]["turns_per_run"] == totals_a["original"]["turns_per_run"] == 5
    assert (totals_b["evaluated"], totals_b["outcomes_changed"]) == (count, count)
    assert totals_b["variant"]["outcomes"] == {"diverged": count}
    assert totals_b["variant"]["cost_per_completed_run_microusd"] is None
    assert {r["first_divergent_turn"] for r in report_b["runs"]} == {1}
    assert {r["origin"] for r in report_b["runs"]} == set(originals)
    # No write executed: the originals' shop has what they did, the evaluation's has nothing.
    assert all(shop_effects(client, r) == EFFECTS for r in originals)
    assert all(shop_effects(client, r["variant"]["run_id"]) == [] for r in report_a["runs"])
    assert _ledger(client, tenant) == before
    # From turn 3 (the refund done) the larger refund never comes up: the recorded email,
    # then the answer; turns 4 and 5 only, no divergence, no write held.
    totals_c = report_c["totals"]
    assert totals_c["variant"]["outcomes"] == {"completed": count}
    assert (totals_c["outcomes_changed"], totals_c["diverged"], totals_c["held_writes"]) == (
        0, 0, 0,
    )  # fmt: skip
    c_run = report_c["runs"][0]["variant"]["run_id"]
    steps = [e["step"] for _, e in client.store.events(judge, c_run) if e["type"] == "turn"]
    assert steps == [4, 5]
    trace = runner.invoke(app, ["trace", c_run, "--redis-url", redis_url])
    assert trace.output.splitlines()[0] == (
        f"forked from {report_c['runs'][0]['origin']} at turn 3 "
        f"(evaluation {c.eval_id}, stop-on-divergence)"
    )
    charged = client.ledger.read(judge)
    own = [r["variant"]["tokens"] for r in (*report_a["runs"], *report_b["runs"])]
    # The third evaluation's runs carry their originals' usage to turn 3: only theirs since.
    own += [r["variant"]["tokens"] - _tokens_to(client, tenant, r["origin"], 3)
            for r in report_c["runs"]]  # fmt: skip
    assert charged["tokens"].committed == sum(own) > 0
    for row in (report_a["runs"][0], report_b["runs"][0]):  # answered from the recording again
        replayed = replay_run(client, row["variant"]["run_id"])
        assert replayed.matches, (replayed.difference, replayed.notes)
    shown = runner.invoke(app, ["eval", "show", a.eval_id, "--redis-url", redis_url])
    assert shown.exit_code == 0, shown.output
    as_json = runner.invoke(app, ["eval", "show", b_id, "--json", "--redis-url", redis_url])
    assert json.loads(as_json.output)["totals"] == totals_b
    line = f"{count} of {count} runs, 0 outcomes changed, {count} diverged, {count} writes held"
    assert line in shown.output


def test_an_evaluation_refuses_bad_input_before_storing_anything(
    redis_url: str, queue: str
) -> None:
    """An unknown mode, the same tenant to charge, a filter that matches nothing, a turn
    outside the runs, a variant that cannot be built: one line each, no evaluation stored;
    an unknown evaluation is not found."""
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    client = client_for(redis_url)
    _originals(client, tenant, queue, 1)
    every = evaluation.Selection(tenant=tenant)
    cases: list[tuple[evaluation.Selection, dict[str, Any], type[Exception], str]] = [
        (every, {"mode": "guess"}, ControlError, "unknown mode 'guess'"),
        (every, {"eval_tenant": tenant}, ControlError, "a tenant of its own"),
        (evaluation.Selection(tenant=tenant, job="nope"), {}, ControlError, "no finished run"),
        (every, {"from_turn": 5}, ForkRefusedError, "turn 5 is outside run"),
        (every, {"params": {"model": "gemini:pro"}}, ForkRefusedError, "cannot be built"),
    ]
    for selection, change, error, message in cases:
        kwargs: dict[str, Any] = {"mode": "replay-reads", "eval_tenant": f"ev-{tenant}",
                                  "from_turn": 0, **change}  # fmt: skip
        variant = Variant(params=kwargs.pop("params", {}))
        with pytest.raises(error, match=message) as caught:
            evaluation.start(client, selection, variant, **kwargs)
        assert "\\n" not in str(caught.value)
    assert client.client.zcard(f"turnstile:{{ev-{tenant}}}:evals") == 0
    said = runner.invoke(app, ["eval", "show", "ev_never", "--redis-url", redis_url])
    assert said.exit_code == 1
    assert said.output.strip() == "error: no evaluation 'ev_never'"


def test_an_evaluation_is_held_to_its_own_tenants_ceilings(redis_url: str, queue: str) -> None:
    """The evaluation's tenant has a hard ceiling of 4,000 tokens, less than its eight runs
    need (about 700 each): it is charged up to its ceiling and no more, the runs it has no
    room for end `budget_exhausted` on it (tenant.tokens), and the originals' tenant, with no
    ceiling, is charged nothing."""
    tenant, judge = (f"{p}-{uuid.uuid4().hex[:8]}" for p in ("t", "ev"))
    client = client_for(redis_url)
    _originals(client, tenant, queue, 8)
    before = _ledger(client, tenant)
    client.ledger.set_ceiling(judge, "tokens", 4000)
    made = evaluation.start(
        client, evaluation.Selection(tenant=tenant), Variant(params={"amount_cents": 5000}),
        mode="replay-reads", eval_tenant=judge, queue=queue,
    )  # fmt: skip
    report = _done(client, made.eval_id)
    outcomes = report["totals"]["variant"]["outcomes"]
    stopped = [r["variant"]["run_id"] for r in report["runs"]
               if r["variant"]["outcome"] == "budget_exhausted"]  # fmt: skip
    assert {client.store.hash(judge, r)["detail"] for r in stopped} == {"tenant.tokens"}
    assert outcomes.get("budget_exhausted", 0) > 0, outcomes
    assert outcomes.get("completed", 0) + outcomes["budget_exhausted"] == 8, outcomes
    assert client.ledger.read(judge)["tokens"].committed <= 4000
    assert _ledger(client, tenant) == before


@pytest.mark.slow
def test_an_evaluation_interrupted_by_a_worker_sigkill_resumes_and_evaluates_each_run_once(
    redis_url: str,
) -> None:
    """The worker running an evaluation is SIGKILLed mid-turn, and the evaluation's record has
    lost the last four runs it submitted (a command killed before it wrote them down);
    `turnstile eval resume` and a new worker finish it: one evaluation run per original, each
    ended once, every one completed."""
    count = 12
    queue, tenant, judge = (f"{p}-{uuid.uuid4().hex[:8]}" for p in ("q", "t", "ev"))
    client = client_for(redis_url)
    with running_workers(redis_url, [queue], 1) as first:
        originals = _originals(client, tenant, queue, count)
        made = evaluation.start(
            client, evaluation.Selection(tenant=tenant), Variant(params={"model_sleep_s": 0.3}),
            mode="replay-reads", eval_tenant=judge, queue=queue,
        )  # fmt: skip

        def some_ended() -> bool:
            rows = evaluation.report(client, made.eval_id)["runs"]
            ended: int = sum(r["variant"]["status"] == "stopped" for r in rows)
            return ended >= 2

        wait_until(some_ended, timeout_s=60, what="a few evaluation runs to end")
        first[0].kill()
    client.client.hdel(keys.evaluation_runs(judge, made.eval_id), *originals[-4:])
    client.client.hset(keys.evaluation(judge, made.eval_id), "status", "submitting")
    said = runner.invoke(  # the variant's model_sleep_s is a drill, on here as in the workers
        app,
        ["eval", "resume", made.eval_id, "--redis-url", redis_url],
        env={"TURNSTILE_ALLOW_DRILLS": "1"},
    )
    assert said.exit_code == 0, said.output
    assert said.output.strip() == f"{made.eval_id}: {count} runs submitted"
    with running_workers(redis_url, [queue], 1):
        report = _done(client, made.eval_id)
    assert report["totals"]["evaluated"] == count
    assert report["totals"]["variant"]["outcomes"] == {"completed": count}
    assert client.client.zcard(keys.runs(judge)) == count  # one run per original, no more
    assert {r["origin"] for r in report["runs"]} == set(originals)
    for row in report["runs"]:
        ended_once(client, judge, row["variant"]["run_id"])
