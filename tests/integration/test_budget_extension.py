"""Budgets a person can extend, end to end: real workers, the real API server, a job that
spends tokens every turn (tests/budget_jobs.py). A run suspends `needs_budget` on its token
limit, is extended over HTTP with the hold's digest and completes; another is stopped and ends
`budget_exhausted (tokens)`; an extension past the tenant's hard ceiling is refused with
nothing written; and every extension that does not apply is a one-line refusal."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from tests.budget_jobs import SPEC
from tests.integration.apiserver import ApiServer, http, make_key, running_api
from tests.integration.workers import WorkerProcess, client_for, running_workers, wait_until
from turnstile.errors import DecisionRefusedError
from turnstile.worker.cli.main import app
from turnstile.worker.client._client import Client
from turnstile.worker.ops import decisions
from turnstile.worker.store import keys

pytestmark = pytest.mark.integration

JOBS = {"TURNSTILE_JOBS": SPEC}
runner = CliRunner()


@pytest.fixture(scope="module")
def queue() -> str:
    return f"x-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def pool(redis_url: str, queue: str) -> Iterator[list[WorkerProcess]]:
    with running_workers(redis_url, [queue], 2, prefix="x", env=JOBS) as workers:
        yield workers


@pytest.fixture(scope="module")
def api(redis_url: str) -> Iterator[ApiServer]:
    with running_api(redis_url, JOBS) as server:
        yield server


@pytest.fixture
def client(
    redis_url: str, pool: list[WorkerProcess], monkeypatch: pytest.MonkeyPatch
) -> Iterator[Client]:
    monkeypatch.setenv("TURNSTILE_JOBS", SPEC)
    with client_for(redis_url) as c:
        yield c


def _submit(
    web: httpx.Client, queue: str, budget: dict[str, int] | None = None, **params: Any
) -> str:
    body = {"user": "u1", "job": "spender", "goal": "say lines", "queue": queue,
            "params": params, "budget": budget}  # fmt: skip
    made = web.post("/v1/runs", json=body)
    assert made.status_code == 202, made.text
    return str(made.json()["run_id"])


def _held(web: httpx.Client, run_id: str, detail: str = "tokens") -> dict[str, Any]:
    """The run's view once it is held `needs_budget`."""
    seen: dict[str, Any] = {}

    def held() -> bool:
        seen.update(web.get(f"/v1/runs/{run_id}").json())
        return seen.get("outcome") == "needs_budget" or seen.get("status") == "stopped"

    wait_until(held, timeout_s=90, what=lambda: f"run {run_id} held needs_budget; saw {seen}")
    assert (seen["status"], seen["outcome"], seen["detail"]) == (
        "suspended", "needs_budget", detail,
    ), seen  # fmt: skip
    return seen


def _ended(client: Client, tenant: str, run_id: str) -> dict[str, str]:
    wait_until(
        lambda: client.store.hash(tenant, run_id).get("status") == "stopped",
        timeout_s=90,
        what=lambda: f"run {run_id} ends; {client.store.hash(tenant, run_id).get('status')}",
    )
    return client.store.hash(tenant, run_id)


def _snapshot(client: Client, tenant: str, run_id: str) -> tuple[Any, ...]:
    """What a refused decision must leave as it was: the run's hash and its stream."""
    stored = client.store.hash(tenant, run_id)
    return stored, client.client.xlen(keys.events(tenant, run_id)), client.ledger.read(tenant)


def test_a_run_held_on_its_token_limit_is_extended_over_http_and_completes(
    redis_url: str, api: ApiServer, client: Client, queue: str, unique: str
) -> None:
    """The hold says what was spent, what the next turn needs and a suggestion, in the run's
    view, its event stream and the suspended listing; approved over HTTP with new limits and
    the digest, the run re-admits with them and completes, and the ledger is exact."""
    tenant = f"xa-{unique}"
    with http(api, make_key(redis_url, tenant)) as web:
        run_id = _submit(web, queue)
        view = _held(web, run_id)
        held = view["pending"]
        assert held["kind"] == "budget" and held["dimensions"] == ["tokens"]
        assert held["spent"]["tokens"] + held["needed"]["tokens"] > held["limits"]["tokens"]
        assert held["suggested"]["tokens"] > held["limits"]["tokens"]
        listed = web.get("/v1/runs", params={"status": "suspended"}).json()["runs"]
        assert [(r["run_id"], r["outcome"], r["detail"]) for r in listed] == [
            (run_id, "needs_budget", "tokens")
        ]
        events = [e for _, e in client.store.events(tenant, run_id)]
        suspended = [e for e in events if e["type"] == "suspended"]
        assert suspended[-1]["kind"] == "budget" and suspended[-1]["digest"] == held["digest"]
        assert suspended[-1]["suggested"] == held["suggested"]
        done = web.post(f"/v1/runs/{run_id}/approve",
                        json={"digest": held["digest"], "extend": {"tokens": 5000}})  # fmt: skip
        assert done.status_code == 200, done.text
        assert done.json()["result"] == "extended"
    stored = _ended(client, tenant, run_id)
    assert stored["outcome"] == "completed", stored
    state = client.state(run_id, tenant)
    assert state.budget.max_tokens == 5000 and state.usage.tokens > held["limits"]["tokens"]
    decision = state.decisions[-1]
    assert (decision.kind, decision.digest, decision.limits) == (
        "extended", held["digest"], {"tokens": 5000},
    )  # fmt: skip
    ledger = client.ledger.read(tenant)
    assert (ledger["tokens"].committed, ledger["tokens"].reserved) == (state.usage.tokens, 0)
    # The extension replays where it happened: the kernel reaches the stored state again.
    replayed = runner.invoke(app, ["replay", run_id, "--json"],
                             env={"TURNSTILE_REDIS_URL": redis_url, **JOBS})  # fmt: skip
    assert json.loads(replayed.stdout)["matches"], replayed.output


def test_a_held_run_that_is_stopped_ends_budget_exhausted_naming_tokens(
    redis_url: str, api: ApiServer, client: Client, queue: str, unique: str
) -> None:
    tenant = f"xb-{unique}"
    with http(api, make_key(redis_url, tenant)) as web:
        run_id = _submit(web, queue)
        _held(web, run_id)
        stopped = web.post(f"/v1/runs/{run_id}/deny", json={"reason": "enough for today"})
        assert stopped.status_code == 200, stopped.text
        assert stopped.json()["outcome"] == "budget_exhausted"
    stored = _ended(client, tenant, run_id)
    assert (stored["outcome"], stored["detail"]) == ("budget_exhausted", "tokens")
    assert "enough for today" in stored["reason"]
    finished = [e for _, e in client.store.events(tenant, run_id) if e["type"] == "finished"]
    assert len(finished) == 1
    state = client.state(run_id, tenant)
    ledger = client.ledger.read(tenant)
    assert (ledger["tokens"].committed, ledger["tokens"].reserved) == (state.usage.tokens, 0)


def test_an_extension_past_the_tenants_hard_ceiling_is_refused_with_nothing_written(
    redis_url: str, api: ApiServer, client: Client, queue: str, unique: str
) -> None:
    """The tenant's hard token ceiling is never extended: an extension to a limit above it, or
    one that gives the run more room than the tenant has left under it, is a 409 with one
    line (one line on the command line, a DecisionRefusedError from the client); the run, its
    stream and the ledger are as they were, and an extension within it goes through."""
    tenant = f"xc-{unique}"
    client.ledger.set_ceiling(tenant, "tokens", 2000, hard=True)
    with http(api, make_key(redis_url, tenant)) as web:
        run_id = _submit(web, queue)
        held = _held(web, run_id)["pending"]
        before = _snapshot(client, tenant, run_id)
        spent = held["spent"]["tokens"]
        for limit, says in ((2001, "hard tokens ceiling of 2000"),
                            (2000, "has")):  # fmt: skip
            client.ledger.reserve(tenant, f"other-{limit}", {"tokens": 100}, timeout_s=60)
            extension = {"digest": held["digest"], "extend": {"tokens": limit}}
            refused = web.post(f"/v1/runs/{run_id}/approve", json=extension)
            client.ledger.release(tenant, f"other-{limit}")
            assert refused.status_code == 409, refused.text
            body = refused.json()
            assert body["code"] == "decision_refused" and says in body["detail"], body
            assert "\n" not in body["detail"]
            assert _snapshot(client, tenant, run_id) == before
        env = {"TURNSTILE_REDIS_URL": redis_url, **JOBS}
        said = runner.invoke(app, ["approve", run_id, "--extend", "tokens=2001"], env=env)
        assert said.exit_code == 1 and said.stderr.count("\n") == 1, said.output
        assert said.stderr.startswith("error: ") and "hard tokens ceiling of 2000" in said.stderr
        with pytest.raises(DecisionRefusedError, match="hard tokens ceiling of 2000"):
            client.approve(run_id, by="ops", extend={"tokens": 2001})
        assert _snapshot(client, tenant, run_id) == before
        assert 2000 - spent > 0
        ok = web.post(f"/v1/runs/{run_id}/approve",
                      json={"digest": held["digest"], "extend": {"tokens": 1500}})  # fmt: skip
        assert ok.status_code == 200, ok.text
    stored = _ended(client, tenant, run_id)
    assert stored["outcome"] in ("completed", "budget_exhausted"), stored
    ledger = client.ledger.read(tenant)
    assert ledger["tokens"].committed <= 2000 and ledger["tokens"].reserved == 0


def test_extensions_that_do_not_apply_are_one_line_refusals_with_nothing_written(
    redis_url: str, api: ApiServer, client: Client, queue: str, unique: str
) -> None:
    """The issue's bad input: an extension on a run that is not waiting for one (running,
    ended, holding a call) or with a stale digest; and malformed limits, over HTTP and on the
    command line. Each is refused in one line; nothing is written."""
    tenant = f"xd-{unique}"
    with http(api, make_key(redis_url, tenant)) as web:
        idle = _submit(web, f"{queue}-idle")  # a queue no worker takes from: it stays running
        assert client.store.hash(tenant, idle)["status"] == "running"
        before = _snapshot(client, tenant, idle)
        refused = web.post(f"/v1/runs/{idle}/approve",
                           json={"digest": "0" * 16, "extend": {"tokens": 9000}})  # fmt: skip
        assert refused.status_code == 409, refused.text
        assert refused.json()["code"] == "decision_refused"
        assert "is running: it is not waiting for a budget extension" in refused.json()["detail"]
        assert _snapshot(client, tenant, idle) == before
        web.post(f"/v1/runs/{idle}/cancel")

        run_id = _submit(web, queue)
        held = _held(web, run_id)["pending"]
        before = _snapshot(client, tenant, run_id)
        digest, just_over = held["digest"], held["limits"]["tokens"] + 1
        bad: list[tuple[str, dict[str, Any], int, str]] = [
            ("0" * 16, {"tokens": 9000}, 409, "is held at"),
            (digest, {"tokens": 10}, 409, "below the run's limit"),
            (digest, {"tokens": just_over}, 409, "leaves no room"),
            (digest, {}, 409, "at least one new limit"),
            (digest, {"tokens": -5}, 422, ""),
            (digest, {"tokens": "9000"}, 422, ""),
            (digest, {"power": 9000}, 422, ""),
            (digest, {"tokens": 5000, "deadline_ms": 10**12}, 409, "a run may have"),
        ]
        for given, extend, status, says in bad:
            body = {"digest": given, "extend": extend}
            got = web.post(f"/v1/runs/{run_id}/approve", json=body)
            assert got.status_code == status, (body, got.text)
            assert says in got.json()["detail"] and "\n" not in got.json()["detail"], got.text
            assert _snapshot(client, tenant, run_id) == before, body
        env = {"TURNSTILE_REDIS_URL": redis_url, **JOBS}
        for args, says in (
            (["--extend", "tokens=abc"], "bad extension 'tokens=abc'"),
            (["--extend", "power=3"], "bad extension 'power=3'"),
            (["--digest", "0" * 16, "--extend", "tokens=9000"], "is held at"),
            (["--extend", f"tokens={just_over}"], "leaves no room for the next turn"),
            (["--extend", "tokens=10"], "below the run's limit"),
        ):
            result = runner.invoke(app, ["approve", run_id, *args], env=env)
            assert result.exit_code == 1, result.output
            assert result.stderr.startswith("error: ") and says in result.stderr, result.stderr
            assert result.stderr.count("\n") == 1
            assert _snapshot(client, tenant, run_id) == before, args
        with pytest.raises(DecisionRefusedError, match="leaves no room for the next turn"):
            client.approve(run_id, by="ops", digest=digest, extend={"tokens": just_over})
        assert _snapshot(client, tenant, run_id) == before
        shown = runner.invoke(app, ["status", run_id, "--json"], env=env)
        assert json.loads(shown.stdout)["pending"]["digest"] == held["digest"]
        table = runner.invoke(app, ["status", run_id], env=env).stdout
        assert "held budget" in table and f"suggested tokens={held['suggested']['tokens']}" in table
        listed = runner.invoke(app, ["runs", "--status", "suspended", "--tenant", tenant,
                                     "--json"], env=env)  # fmt: skip
        assert [r["outcome"] for r in json.loads(listed.stdout)["runs"]] == ["needs_budget"]
        # The CLI's extension goes through; a second one finds the run no longer waiting.
        ok = runner.invoke(app, ["approve", run_id, "--digest", held["digest"],
                                 "--extend", "tokens=5000"], env=env)  # fmt: skip
        assert ok.exit_code == 0 and "extended run" in ok.stdout, ok.output
        again = runner.invoke(app, ["approve", run_id, "--digest", held["digest"],
                                    "--extend", "tokens=6000"], env=env)  # fmt: skip
        assert again.exit_code == 1 and again.stderr.count("\n") == 1, again.output
        refusals = ("not waiting for a budget extension", "nothing to extend")
        assert any(says in again.stderr for says in refusals), again.stderr
    assert _ended(client, tenant, run_id)["outcome"] == "completed"
    with pytest.raises(DecisionRefusedError, match="already ended"):
        decisions.approve(client, run_id, by="ops", extend={"tokens": 9000})


def test_a_run_held_by_its_tenants_soft_ceiling_is_extended_by_raising_it(
    redis_url: str, api: ApiServer, client: Client, queue: str, unique: str
) -> None:
    """A tenant that made its soft token ceiling extendable (`tenants set ... extendable=
    tenant.tokens`) has a run held before the turn that would pass it, the turn's hold given
    back; the extension raises the soft ceiling (never a hard one) and the run completes."""
    tenant = f"xe-{unique}"
    env = {"TURNSTILE_REDIS_URL": redis_url, **JOBS}
    bad = runner.invoke(app, ["tenants", "set", tenant, "extendable=tokenz"], env=env)
    assert bad.exit_code == 1 and "'tokenz' is not a budget dimension" in bad.stderr, bad.output
    assert client.client.hget(keys.caps(tenant), "extendable") is None
    made = runner.invoke(app, ["tenants", "set", tenant, "extendable=tenant.tokens"], env=env)
    assert made.exit_code == 0 and "extendable=tenant.tokens" in made.stdout, made.output
    client.ledger.set_ceiling(tenant, "tokens", 250, hard=False)
    with http(api, make_key(redis_url, tenant)) as web:
        run_id = _submit(web, queue, {"max_tokens": 5000})
        held = _held(web, run_id, "tenant.tokens")["pending"]
        assert held["dimensions"] == ["tenant.tokens"] and held["limits"] == {"tenant.tokens": 250}
        assert held["spent"]["tenant.tokens"] + held["needed"]["tenant.tokens"] > 250
        assert client.ledger.read(tenant)["tokens"].reserved == 0  # the turn's hold given back
        body = {"digest": held["digest"], "extend": {"tenant.cost_microusd": 10**6}}
        refused = web.post(f"/v1/runs/{run_id}/approve", json=body)
        assert refused.status_code == 409 and "cannot extend" in refused.json()["detail"]
        client.ledger.set_ceiling(tenant, "tokens", 250, hard=True)  # made hard meanwhile
        before = _snapshot(client, tenant, run_id)
        body = {"digest": held["digest"], "extend": {"tenant.tokens": 3000}}
        refused = web.post(f"/v1/runs/{run_id}/approve", json=body)
        assert refused.status_code == 409 and "never extended" in refused.json()["detail"]
        assert _snapshot(client, tenant, run_id) == before
        client.ledger.set_ceiling(tenant, "tokens", 250, hard=False)
        ok = web.post(f"/v1/runs/{run_id}/approve", json=body)
        assert ok.status_code == 200 and ok.json()["result"] == "extended", ok.text
    ledger = client.ledger.read(tenant)
    assert (ledger["tokens"].ceiling, ledger["tokens"].hard) == (3000, False)
    stored = _ended(client, tenant, run_id)
    assert stored["outcome"] == "completed", stored
    state = client.state(run_id, tenant)
    ledger = client.ledger.read(tenant)
    assert (ledger["tokens"].committed, ledger["tokens"].reserved) == (state.usage.tokens, 0)
