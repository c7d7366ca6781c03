"""A held call its tenant cannot afford, through real workers, the CLI and the real API server:
a refund of 8000 held for approval while the tenant's hard refund_cents ceiling has 5000 left.
`turnstile status` and `GET /v1/runs/{id}` show what the call charges and why approving it is
refused; the approval is refused in one line by the client, the CLI and HTTP, nothing written
(before, it was accepted and the run ended `budget_exhausted` at once, the refund never made).
A soft ceiling never refuses; a hard one with room approves, and the refund is made once."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from typer.testing import CliRunner

from tests.integration.apiserver import ApiServer, http, make_key, running_api
from tests.integration.workers import (
    WorkerProcess,
    client_for,
    running_workers,
    shop_effects,
    wait_until,
)
from turnstile.errors import DecisionRefusedError
from turnstile.jobs.support.scenarios import BY_LETTER, GOAL, USER
from turnstile.worker.cli.main import app
from turnstile.worker.client._client import Client
from turnstile.worker.ops import decisions
from turnstile.worker.store import keys

pytestmark = pytest.mark.integration

runner = CliRunner()


@pytest.fixture(scope="module")
def queue() -> str:
    return f"room-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def pool(redis_url: str, queue: str) -> Iterator[list[WorkerProcess]]:
    with running_workers(redis_url, [queue], 1, prefix="room") as workers:
        yield workers


@pytest.fixture(scope="module")
def api(redis_url: str) -> Iterator[ApiServer]:
    with running_api(redis_url) as server:
        yield server


def _held(client: Client, tenant: str, queue: str) -> str:
    run_id = client.submit(tenant, USER, "support", GOAL, BY_LETTER["G"].params, queue=queue)
    wait_until(lambda: client.store.hash(tenant, run_id).get("status") == "suspended",
               timeout_s=90, what=f"run {run_id} to hold its refund")  # fmt: skip
    return run_id


def _snapshot(client: Client, tenant: str, run_id: str) -> tuple[Any, ...]:
    stored = client.store.hash(tenant, run_id)
    return stored, client.client.xlen(keys.events(tenant, run_id)), client.ledger.read(tenant)


def test_a_held_call_the_tenant_cannot_afford_is_shown_and_its_approval_refused_everywhere(
    redis_url: str, api: ApiServer, pool: list[WorkerProcess], queue: str, unique: str
) -> None:
    tenant = f"room-{unique}"
    client = client_for(redis_url)
    run_id = _held(client, tenant, queue)
    # Lowered after the refund was held (a ceiling below the call at its first try ends the
    # run there): the call waits for a person the tenant can no longer pay for.
    client.ledger.set_ceiling(tenant, "refund_cents", 5000, hard=True)
    digest = client.state(run_id, tenant).pending.digest  # type: ignore[union-attr]
    env = {"TURNSTILE_REDIS_URL": redis_url}
    why = (
        f"the held call issue_refund charges 8000 refund_cents and tenant '{tenant}' has 5000 "
        f"left under its hard refund_cents ceiling of 5000: raise it (turnstile ledger set "
        f"{tenant} refund_cents=N) or deny the call"
    )
    refusal = f"cannot approve run {run_id}: {why}"
    shown = json.loads(runner.invoke(app, ["status", run_id, "--json"], env=env).stdout)
    assert shown["pending"]["charges"] == {"refund_cents": 8000}
    assert shown["pending"]["no_room"] == why
    table = runner.invoke(app, ["status", run_id], env={**env, "COLUMNS": "400"}).stdout
    assert "cannot approve" in table and "refund_cents=8000" in table
    before = _snapshot(client, tenant, run_id)
    with pytest.raises(DecisionRefusedError) as refused:
        client.approve(run_id, by="ops", digest=digest)
    assert str(refused.value) == refusal
    with pytest.raises(DecisionRefusedError, match="has 5000 left under its hard"):
        decisions.approve(client, run_id, by="ops")
    said = runner.invoke(app, ["approve", run_id], env=env)
    assert said.exit_code == 1 and said.stderr == f"error: {refusal}\n", said.output
    with http(api, make_key(redis_url, tenant)) as web:
        assert web.get(f"/v1/runs/{run_id}").json()["pending"]["no_room"] == why
        reply = web.post(f"/v1/runs/{run_id}/approve", json={"digest": digest})
    assert reply.status_code == 409, reply.text
    assert (reply.json()["code"], reply.json()["detail"]) == ("decision_refused", refusal)
    assert _snapshot(client, tenant, run_id) == before
    assert shop_effects(client, run_id) == []
    # A soft ceiling never refuses a call: it reports that the refund passed it.
    client.ledger.set_ceiling(tenant, "refund_cents", 5000, hard=False)
    assert client.approve(run_id, by="ops", digest=digest).status.value == "running"
    wait_until(lambda: client.store.hash(tenant, run_id).get("status") == "stopped",
               timeout_s=90, what="the approved run to end")  # fmt: skip
    state = client.state(run_id, tenant)
    assert state.outcome is not None and state.outcome.value == "completed", state.reason
    assert shop_effects(client, run_id) == [
        ["refund", "ord_1004", 8000],
        ["email", "ord_1004"],
    ]
    assert client.ledger.read(tenant)["refund_cents"].committed == 8000


def test_a_held_call_within_the_hard_ceiling_shows_no_refusal_and_is_approved(
    redis_url: str, pool: list[WorkerProcess], queue: str, unique: str
) -> None:
    """8000 of a hard ceiling of 10000: the view says what the call charges and nothing
    refuses it; the approval goes through and the refund is made once."""
    tenant = f"roomy-{unique}"
    client = client_for(redis_url)
    client.ledger.set_ceiling(tenant, "refund_cents", 10_000, hard=True)
    run_id = _held(client, tenant, queue)
    shown = json.loads(runner.invoke(app, ["status", run_id, "--json"],
                                     env={"TURNSTILE_REDIS_URL": redis_url}).stdout)  # fmt: skip
    assert (shown["pending"]["charges"], shown["pending"]["no_room"]) == (
        {"refund_cents": 8000}, None,
    )  # fmt: skip
    client.approve(run_id, by="ops")
    wait_until(lambda: client.store.hash(tenant, run_id).get("status") == "stopped",
               timeout_s=90, what="the approved run to end")  # fmt: skip
    assert client.ledger.read(tenant)["refund_cents"].committed == 8000
