"""Jobs as plugins through real workers and the CLI: broken plugins named once and skipped,
runs of unknown or broken jobs refused with the known ones, params refused at submit."""

from __future__ import annotations

import json
import uuid

import pytest
from typer.testing import CliRunner, Result

from tests.integration.workers import client_for, running_workers, wait_until
from turnstile.errors import SubmissionError
from turnstile.worker.broker import layout
from turnstile.worker.cli.main import app
from turnstile.worker.client._client import RUN_TENANTS
from turnstile.worker.store import keys

pytestmark = pytest.mark.integration

runner = CliRunner()
P = "tests.plugins"
BROKEN = ["no_such_module_xyz:job", f"{P}:raises", f"{P}:not_a_job", f"{P}:bad_schema"]
SPEC = ",".join([f"{P}:good", *BROKEN])


def cli(redis_url: str, *args: str, **env: str) -> Result:
    return runner.invoke(app, list(args), env={"TURNSTILE_REDIS_URL": redis_url, **env})


def one_line_error(result: Result, message: str) -> None:
    assert result.exit_code == 1, result.output
    assert result.stderr.startswith("error: ") and message in result.stderr, result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.output


def test_a_worker_runs_the_good_jobs_and_names_each_broken_plugin_once(
    redis_url: str, unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With four broken plugins beside a good one, the worker starts, logs one line per broken
    plugin naming it and why, and runs the good job; a run of an unknown job is refused with
    the list of known jobs."""
    monkeypatch.setenv("TURNSTILE_JOBS", SPEC)
    queue = f"jobs-{unique}"
    with running_workers(redis_url, [queue], 1, env={"TURNSTILE_JOBS": SPEC}) as (worker,):
        client = client_for(redis_url)
        run_id = client.submit(f"t-{unique}", "u1", "toy_good", "say hi", {"level": 2},
                               queue=queue)  # fmt: skip
        wait_until(lambda: client.state(run_id).outcome is not None, what="the toy run ends")
        assert client.state(run_id).outcome.value == "completed"  # type: ignore[union-attr]
        lines = worker.events("job_plugin_broken")
        assert sorted(line["plugin"] for line in lines) == sorted(
            f"TURNSTILE_JOBS {ref}" for ref in BROKEN
        )
        assert all(line["reason"] for line in lines)
        (ready,) = worker.events("worker_jobs")
        assert ready["jobs"] == ["support", "toy_good"]
        with pytest.raises(
            SubmissionError, match="unknown job 'toy'; known jobs: support, toy_good"
        ):
            client.submit(f"t-{unique}", "u1", "toy", "say hi", queue=queue)


def test_a_tool_value_that_is_no_json_is_logged_once_by_the_worker(
    redis_url: str, unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tool returning a set: the run's trace shows `bad_result`, and the worker's log has
    one `tool_bad_result` line with the run, the turn, the tool and the value's type."""
    spec = f"{P}:bad_value"
    monkeypatch.setenv("TURNSTILE_JOBS", spec)  # the client sees the job as the worker does
    queue = f"bad-{unique}"
    with running_workers(redis_url, [queue], 1, env={"TURNSTILE_JOBS": spec}) as (worker,):
        client = client_for(redis_url)
        run_id = client.submit(f"t-{unique}", "u1", "toy_bad_value", "when is A-1 back?",
                               queue=queue)  # fmt: skip
        wait_until(lambda: client.state(run_id).outcome is not None, what="the run ends")
        wait_until(lambda: bool(worker.events("tool_bad_result")), what="the log line")
        logged = [e for e in worker.events("tool_bad_result") if e.get("run_id") == run_id]
    traced = cli(redis_url, "trace", run_id).stdout
    assert "tool stock_dates bad_result (not JSON: result is a set, not a JSON value)" in traced
    (line,) = logged
    assert (line["level"], line["turn"], line["tool"], line["value_type"]) == (
        "error", 1, "stock_dates", "set"
    )  # fmt: skip
    assert line["detail"] == "not JSON: result is a set, not a JSON value"


def test_turnstile_jobs_lists_ok_and_broken_plugins_with_params(redis_url: str) -> None:
    """`turnstile jobs --json` shows every registration, the broken ones with why, and
    `turnstile jobs NAME` a job's params schema and tools."""
    rows = json.loads(cli(redis_url, "jobs", "--json", TURNSTILE_JOBS=SPEC).stdout)
    status = {r["source"]: r["status"] for r in rows}
    assert status["entry point support = turnstile.support:support"] == "ok"
    assert status[f"TURNSTILE_JOBS {P}:good"] == "ok"
    assert {s for s, v in status.items() if v == "broken"} == {
        f"TURNSTILE_JOBS {b}" for b in BROKEN
    }
    one = json.loads(cli(redis_url, "jobs", "toy_good", "--json", TURNSTILE_JOBS=SPEC).stdout)
    assert one["params_schema"]["properties"] == {
        "level": {"type": "integer", "minimum": 1, "maximum": 3}
    }
    assert [t["name"] for t in one["tools"]] == ["echo"]
    one_line_error(cli(redis_url, "jobs", "toy"), "unknown job 'toy'; known jobs: support")


def test_turnstile_jobs_exits_1_naming_broken_plugins_and_says_why_for_one(
    redis_url: str,
) -> None:
    """`turnstile jobs` with a job whose default model names an unknown provider and a plugin
    that does not import lists them broken with why, the good ones ok, and exits 1 naming the
    broken ones (0 when none is); `jobs NAME` of the broken job, and `submit` of it, is one
    line with why; `jobs NAME` of a name no job has gives the reasons of the plugins that broke
    before naming themselves (one of them may be it)."""
    spec = f"{P}:good,{P}:bad_provider,no_such_module_xyz:job"
    listed = cli(redis_url, "jobs", "--json", TURNSTILE_JOBS=spec)
    assert listed.exit_code == 1, listed.output
    rows = {r["name"] or r["source"]: r for r in json.loads(listed.stdout)}
    assert {k: r["status"] for k, r in rows.items()} == {
        "support": "ok", "toy_good": "ok", "toy_bad_provider": "broken",
        "TURNSTILE_JOBS no_such_module_xyz:job": "broken",
    }  # fmt: skip
    assert rows["toy_bad_provider"]["error"].startswith(
        "ProviderConfigError: unknown provider 'opneai' in model 'opneai:gpt-4.1-mini'; "
        "did you mean openai:gpt-4.1-mini?"
    )
    assert listed.stderr == (
        "error: 2 job plugin(s) broken, each with why above: toy_bad_provider, "
        "TURNSTILE_JOBS no_such_module_xyz:job\n"
    )
    assert cli(redis_url, "jobs", TURNSTILE_JOBS=f"{P}:good").exit_code == 0
    why = "job 'toy_bad_provider' is broken (ProviderConfigError: unknown provider 'opneai'"
    one_line_error(cli(redis_url, "jobs", "toy_bad_provider", TURNSTILE_JOBS=spec), why)
    submit = ["submit", "--job", "toy_bad_provider", "--tenant", "t", "--user", "u", "--goal", "g"]
    one_line_error(cli(redis_url, *submit, TURNSTILE_JOBS=spec), why)
    one_line_error(
        cli(redis_url, "jobs", "toy", TURNSTILE_JOBS=spec),
        "unknown job 'toy'; known jobs: support, toy_good; broken, and it may be one of them: "
        "TURNSTILE_JOBS no_such_module_xyz:job: ModuleNotFoundError: No module named "
        "'no_such_module_xyz'",
    )


@pytest.mark.parametrize(
    ("param", "message"),
    [
        ("amount_cent=8000", "params.amount_cent: unknown key for job 'support' (known: "),
        ("amount_cents=lots", "params.amount_cents: 'lots' is not of type 'integer'"),
        ("amount_cents=0", "params.amount_cents: 0 is less than the minimum of 1"),
        ('tool_latency_s={"get_order": 9000}', "params.tool_latency_s.get_order: 9000 is greater"),
    ],
)
def test_bad_params_are_refused_at_submit_and_nothing_is_written(
    redis_url: str, param: str, message: str
) -> None:
    """Unknown, mistyped and out-of-range params: one line naming the key, from the CLI and
    from Python, and no run, no event and no message exist afterwards."""
    run_id = f"run_{uuid.uuid4().hex[:12]}"
    queue = f"q-{run_id}"
    args = ["submit", "--job", "support", "--tenant", "acme", "--user", "u1", "--goal",
            "refund ord_1001", "--param", param, "--run-id", run_id, "--queue", queue]  # fmt: skip
    one_line_error(cli(redis_url, *args), message)
    client = client_for(redis_url)
    key, _, raw = param.partition("=")
    try:
        value = json.loads(raw)
    except ValueError:
        value = raw
    with pytest.raises(SubmissionError, match=message.replace("(", r"\(").replace(".", r"\.")):
        client.submit("acme", "u1", "support", "refund", {key: value}, run_id=run_id, queue=queue)
    assert client.client.hget(RUN_TENANTS, run_id) is None
    assert not client.client.exists(keys.run("acme", run_id))
    assert client.client.llen(layout.broker_queue(queue)) == 0


def test_params_that_are_not_an_object_are_refused(redis_url: str) -> None:
    """Params given as a list (or anything but a mapping) are one clear error, not a crash."""
    client = client_for(redis_url)
    with pytest.raises(SubmissionError, match="params must be a JSON object, not list"):
        client.submit("acme", "u1", "support", "refund", ["amount_cents", 1])  # type: ignore[arg-type]


def test_a_job_dimension_can_be_capped_from_the_cli(redis_url: str, unique: str) -> None:
    """`turnstile ledger set T refund_cents=N --period day` takes the support job's own
    dimension; a dimension no job declares is refused."""
    tenant = f"acme-{unique}"
    result = cli(redis_url, "ledger", "set", tenant, "refund_cents=500000", "--period", "day")
    assert result.exit_code == 0, result.output
    shown = json.loads(cli(redis_url, "ledger", "show", tenant, "--json").stdout)
    assert "refund_cents" in json.dumps(shown) and "500000" in json.dumps(shown)
    bad = cli(redis_url, "ledger", "set", tenant, "bananas=5")
    assert bad.exit_code != 0 and "bananas" in bad.output


def test_the_cli_refuses_runs_and_demos_of_unknown_jobs(redis_url: str) -> None:
    """`submit --job` and `demo --job` of a job nobody registered: one line with the known
    jobs, before anything starts or is written."""
    args = ["submit", "--tenant", "acme", "--user", "u1", "--goal", "g", "--job", "nope"]
    one_line_error(cli(redis_url, *args), "unknown job 'nope'; known jobs: support")
    one_line_error(
        cli(redis_url, "demo", "--job", "nope"), "unknown job 'nope'; known jobs: support"
    )
