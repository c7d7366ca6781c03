"""A job from a package outside the project, found by its entry point, on a real worker: its
plain-value tools complete a run, the tool that raises is shown with its reason by `trace`,
`watch` and `status`, and logged once with its traceback. `Client.wait` and `Client.events`
against the same worker."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from tests.fixture_dist import FIXTURES, install, pythonpath
from tests.integration.workers import WorkerProcess, client_for, running_workers, wait_until
from tests.unit.test_readme_example import readme_code
from tests.wire.wire import wire_server
from turnstile import RunEvent, WaitTimeoutError
from turnstile.errors import InvalidEventIdError, RunNotFoundError
from turnstile.jobs.support.scenarios import GOAL, USER
from turnstile.worker.cli.main import app
from turnstile.worker.client._client import Client
from turnstile.worker.store import keys

pytestmark = pytest.mark.integration

runner = CliRunner()
SLOW = {"sleep_s": {"get_order": 0.6, "send_status_email": 0.6}}  # lived, not reported


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """The orders package installed by entry point, for the worker and this process."""
    return install(FIXTURES / "orders_agent", tmp_path_factory.mktemp("orders") / "site")


@pytest.fixture(scope="module")
def queue() -> str:
    return f"outside-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def worker(redis_url: str, queue: str, site: list[str]) -> Iterator[WorkerProcess]:
    env = {"PYTHONPATH": pythonpath(site)}
    with running_workers(redis_url, [queue], 1, env=env) as (started,):
        yield started


@pytest.fixture
def client(
    redis_url: str, worker: WorkerProcess, site: list[str], monkeypatch: pytest.MonkeyPatch
) -> Client:
    """A client that sees the orders job too (it checks a submission's job and params)."""
    for entry in reversed(site):
        monkeypatch.syspath_prepend(entry)
    return client_for(redis_url)


def cli(redis_url: str, *args: str) -> Result:
    result = runner.invoke(app, list(args), env={"TURNSTILE_REDIS_URL": redis_url,
                                                 "COLUMNS": "250"})  # fmt: skip
    assert result.exit_code == 0, result.output
    return result


RAISED = "check_stock->tool_raised (RuntimeError: orders database is on fire)"


def test_an_outside_jobs_plain_tools_complete_and_the_raise_is_readable_and_logged_once(
    redis_url: str, client: Client, worker: WorkerProcess, queue: str, unique: str
) -> None:
    """The orders job's tools return a dict (with a `status` of its own), text and a list, and
    one raises: the run completes with an answer built from them; `trace`, `watch` and
    `status` show the raise's type and message beside its code, and the worker logged it
    once, with its traceback, bound to the run, the turn and the tool (a replay, which runs
    the tools again, logs nothing)."""
    run_id = client.submit(f"t-{unique}", "u1", "orders", "where is my order?",
                           {"order_id": "A-1"}, queue=queue)  # fmt: skip
    state = client.wait(run_id, timeout_s=60)
    assert state.outcome is not None and state.outcome.value == "completed", state.reason
    assert state.answer == (
        "Order A-1 is shipped: parcel for A-1 is in transit, arriving Tuesday. 2 returns. "
        "Stock unknown (tool_raised)."
    )

    traced = cli(redis_url, "trace", run_id).stdout
    assert "t1.c1 tool get_order ok" in traced
    assert "t2.c3 tool check_stock tool_raised (RuntimeError: orders database is on fire)" in (
        traced
    )
    watched = cli(redis_url, "watch", run_id).stdout
    assert f"turn 2: track_parcel->ok, list_returns->ok, {RAISED} |" in watched
    assert RAISED in cli(redis_url, "status", run_id).stdout
    replayed = json.loads(cli(redis_url, "replay", run_id, "--json").stdout)  # no log line in it
    assert replayed["matches"] is True

    wait_until(lambda: bool(worker.events("tool_raised")), what="the log line", timeout_s=10)
    (logged,) = [e for e in worker.events("tool_raised") if e.get("run_id") == run_id]
    assert (logged["tool"], logged["turn"], logged["level"]) == ("check_stock", 2, "error")
    assert logged["error"] == "RuntimeError: orders database is on fire"
    assert logged["exception"].startswith("Traceback (most recent call last):")
    assert "in check_stock" in logged["exception"]
    assert logged["exception"].rstrip().endswith("RuntimeError: orders database is on fire")


def test_runs_and_status_show_the_reason_beside_the_code(
    redis_url: str, client: Client, queue: str, unique: str
) -> None:
    """A run that ends loop_detected shows `repeated_call: <why>` in `runs`, and the outcome,
    its detail and its reason on one line in `status`."""
    tenant = f"t-{unique}"
    run_id = client.submit(tenant, USER, "support", GOAL, {"model": "same_call"}, queue=queue)
    state = client.wait(run_id, timeout_s=60)
    assert state.outcome is not None and state.outcome.value == "loop_detected"
    why = "the same call was proposed more than 2 times"
    assert f"repeated_call: {why}" in cli(redis_url, "runs", "--tenant", tenant).stdout
    (row,) = json.loads(cli(redis_url, "runs", "--tenant", tenant, "--json").stdout)["runs"]
    assert (row["detail"], row["reason"]) == ("repeated_call", why)
    assert f"loop_detected (repeated_call): {why}" in cli(redis_url, "status", run_id).stdout


def test_wait_gives_up_after_its_timeout_then_returns_the_stopped_state(
    client: Client, queue: str, unique: str
) -> None:
    """On a running run, wait raises WaitTimeoutError once timeout_s has passed (not much
    later); waited again, it returns the state as soon as the run stops."""
    run_id = client.submit(f"t-{unique}", USER, "support", GOAL, SLOW, queue=queue)
    started = time.monotonic()
    with pytest.raises(WaitTimeoutError, match=rf"run {run_id} is still running after 0.3 s"):
        client.wait(run_id, timeout_s=0.3)
    assert 0.3 <= time.monotonic() - started < 1.5
    state = client.wait(run_id, timeout_s=60)
    assert state.status.value == "stopped" and state.outcome is not None
    assert client.run_hash(run_id)[1]["status"] == "stopped"
    with pytest.raises(RunNotFoundError, match="no run 'run_nope'"):
        client.wait("run_nope", timeout_s=1)


def test_events_replays_the_stored_ones_then_follows_live_ones_until_finished(
    client: Client, queue: str, unique: str
) -> None:
    """events() yields every stored event in order from the first, then each new one as it is
    committed, and ends after `finished`; `after` resumes past an id; a bad id or an unknown
    run is refused when called."""
    run_id = client.submit(f"t-{unique}", USER, "support", GOAL, SLOW, queue=queue)
    seen: list[tuple[RunEvent, str]] = []
    for event in client.events(run_id):
        seen.append((event, client.run_hash(run_id)[1]["status"]))
    events = [e for e, _ in seen]
    assert events[0].type == "submitted" and events[-1].type == "finished"
    assert [e.type for e in events].count("turn") == 5
    assert events[-1].data["outcome"] == "completed"
    ids = [tuple(map(int, e.id.split("-"))) for e in events]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    assert any(status == "running" for e, status in seen if e.type == "turn")  # followed live
    assert list(client.events(run_id, after=events[1].id)) == events[2:]
    assert list(client.events(run_id, after=events[-1].id)) == []  # nothing after finished
    with pytest.raises(InvalidEventIdError, match="bad event id 'latest'"):
        client.events(run_id, after="latest")
    with pytest.raises(RunNotFoundError):
        client.events("run_nope")


@pytest.mark.parametrize("budget_hold", [False, True], ids=["call", "call-then-budget"])
def test_readme_client_snippet_runs_as_written(
    redis_url: str, unique: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    budget_hold: bool,
) -> None:  # fmt: skip
    """The job of docs/jobs.md (once the README's), saved as a module and named in
    TURNSTILE_JOBS (the way to develop a job without building a wheel), runs on a worker; the
    page's client code, run as written (its server URL and tenant swapped for the test's),
    waits through the approval the irreversible credit needs and ends with the credit granted.
    Its loop handles a budget hold too: a tenant whose soft credit_cents ceiling (500) holds its
    runs has the approved credit held `needs_budget` next, and the loop's approval extends it
    by the suggestion."""
    job_code, client_code = readme_code()
    (tmp_path / "readme_credits.py").write_text(job_code)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("TURNSTILE_JOBS", "readme_credits:credits")
    env = {"PYTHONPATH": pythonpath([str(tmp_path)]), "TURNSTILE_JOBS": "readme_credits:credits"}
    tenant = f"acme-{unique}"
    code = client_code.replace("redis://localhost:6379/0", redis_url)
    code = code.replace('"acme"', f'"{tenant}"')
    assert code.count(tenant) == 1 and redis_url in code
    if budget_hold:
        setup = client_for(redis_url)
        setup.client.hset(keys.caps(tenant), "extendable", "tenant.credit_cents")
        setup.ledger.set_ceiling(tenant, "credit_cents", 500, hard=False)
    with running_workers(redis_url, ["default"], 1, env=env):
        namespace: dict[str, object] = {"__name__": "readme_client"}
        exec(compile(code, "docs/jobs.md", "exec"), namespace)  # noqa: S102 - our own docs
    state = namespace["state"]
    assert getattr(state, "outcome").value == "completed"  # noqa: B009 - an exec'd namespace
    assert getattr(state, "usage").extra == {"credit_cents": 1000}  # noqa: B009
    kinds = [d.kind for d in getattr(state, "decisions")]  # noqa: B009
    assert kinds == (["approved", "extended"] if budget_hold else ["approved"])
    if budget_hold:  # the suggestion: what the tenant spent, what the call needs, half again
        assert setup.ledger.read(tenant)["credit_cents"].ceiling == 1000 + 500 // 2


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_the_outside_package_runs_on_a_provider_model_and_its_raise_is_readable(
    redis_url: str, site: list[str], unique: str, provider: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same package's job, found by its entry point, on `openai:` and on `anthropic:`
    against a wire-format server driving its declared tools: the run completes on the
    provider's replies, the tool that raises is a `tool_raised` observation shown with its
    reason by `trace`, and the worker logged it once, with its traceback."""
    for entry in reversed(site):
        monkeypatch.syspath_prepend(entry)
    client = client_for(redis_url)
    model = "openai:gpt-4.1-mini" if provider == "openai" else "anthropic:claude-sonnet-4-6"
    script = {"agent": {"off_plan": ["check_stock"],
                        "args": {"get_order": {"order_id": "A-1"},
                                 "track_parcel": {"order_id": "A-1"},
                                 "list_returns": {"order_id": "A-1"},
                                 "check_stock": {"sku": "SKU-7"}}}}  # fmt: skip
    queue = f"outside-{provider}-{unique}"
    with (
        wire_server(provider, script=script) as wire,
        running_workers(redis_url, [queue], 1,
                        env={"PYTHONPATH": pythonpath(site), **wire.env}) as (started,),
    ):  # fmt: skip
        run_id = client.submit(f"t-{unique}", "u1", "orders", "where is my order?",
                               {"order_id": "A-1", "model": model}, queue=queue)  # fmt: skip
        state = client.wait(run_id, timeout_s=90)
        assert state.outcome is not None and state.outcome.value == "completed", state.reason
        assert wire.received(), "the provider's server answered the turns"
        traced = cli(redis_url, "trace", run_id).stdout
        assert "tool check_stock tool_raised (RuntimeError: orders database is on fire)" in traced
        wait_until(lambda: bool(started.events("tool_raised")), what="the log line", timeout_s=10)
        logged = [e for e in started.events("tool_raised") if e.get("run_id") == run_id]
    assert len(logged) == 1 and logged[0]["tool"] == "check_stock"
    assert logged[0]["exception"].startswith("Traceback (most recent call last):")
