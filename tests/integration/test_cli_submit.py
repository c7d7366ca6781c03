"""`turnstile submit` without the demo's defaults: `--job` must be named, and `--budget
KEY=VALUE` sets the run's limits with the Python client's checks, a bad one in one line with
nothing written."""

from __future__ import annotations

import json
import uuid

import pytest
from typer.testing import CliRunner, Result

from tests.integration.workers import client_for
from turnstile.errors import SubmissionError
from turnstile.jobs.support.scenarios import GOAL, USER
from turnstile.worker.cli.main import app
from turnstile.worker.client._client import RUN_TENANTS
from turnstile.worker.store import keys

pytestmark = pytest.mark.integration

runner = CliRunner()


def submit(redis_url: str, tenant: str, *args: str) -> Result:
    return runner.invoke(
        app, ["submit", "--tenant", tenant, "--user", USER, "--goal", GOAL, *args],
        env={"TURNSTILE_REDIS_URL": redis_url},
    )  # fmt: skip


def test_a_submit_without_a_job_is_a_usage_error_and_runs_nothing(
    redis_url: str, unique: str
) -> None:
    """Without --job (it used to run the demo's support job) the command says the option is
    missing, exit 2, and no run is stored for the tenant."""
    tenant = f"t-{unique}"
    result = submit(redis_url, tenant, "--queue", f"idle-{unique}")
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("turnstile: Missing option '--job'")
    assert result.stderr.count("\n") == 1
    assert client_for(redis_url).client.zcard(keys.runs(tenant)) == 0


def test_budget_pairs_set_the_runs_limits_and_the_job_gives_the_rest(
    redis_url: str, unique: str
) -> None:
    """`--budget max_steps=3 --budget max_tool_calls=2` is the run's budget over the job's
    own: those two limits set, every other one the job's."""
    limits = ["--budget", "max_steps=3", "--budget", "max_tool_calls=2"]
    result = submit(redis_url, f"t-{unique}", "--job", "support", "--queue", f"idle-{unique}",
                    *limits, "--json")  # fmt: skip
    assert result.exit_code == 0, result.output
    client = client_for(redis_url)
    budget = client.state(json.loads(result.stdout)["run_id"]).budget
    default = client.jobs.get("support").budget
    assert (budget.max_steps, budget.max_tool_calls) == (3, 2)
    assert budget.deadline_ms == default.deadline_ms
    assert budget.max_output_tokens == default.max_output_tokens


BAD_BUDGETS = [
    ("max_stpes=3", {"max_stpes": 3},
     "budget: unknown field 'max_stpes'; did you mean max_steps? (fields: max_steps, "),
    ("max_steps=lots", {"max_steps": "lots"},
     "budget: Expected `int`, got `str` - at `$.max_steps`"),
    ("max_steps=-1", {"max_steps": -1}, "budget: max_steps must be a non-negative integer"),
    ("deadline_ms=99999999999", {"deadline_ms": 99999999999},
     "deadline above the 3600 s a run may have"),
]  # fmt: skip


@pytest.mark.parametrize(("pair", "given", "message"), BAD_BUDGETS,
                         ids=[p for p, _, _ in BAD_BUDGETS])  # fmt: skip
def test_a_bad_budget_is_one_line_from_the_cli_and_the_client_and_nothing_is_written(
    redis_url: str, pair: str, given: dict[str, object], message: str
) -> None:
    """An unknown limit (with the closest name), a value that is not a whole number, a
    negative one, a deadline over the most a run may have: the same line from `--budget` and
    from the client's `budget`, and no run, no run id and no event exist afterwards."""
    tenant, run_id = f"t-{uuid.uuid4().hex[:10]}", f"run_{uuid.uuid4().hex[:12]}"
    result = submit(redis_url, tenant, "--job", "support", "--run-id", run_id, "--budget", pair)
    assert result.exit_code == 1, result.output
    assert result.stderr.startswith(f"error: {message}"), result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.output
    client = client_for(redis_url)
    with pytest.raises(SubmissionError) as caught:
        client.submit(tenant, USER, "support", GOAL, budget=given, run_id=run_id)
    assert str(caught.value).startswith(message)
    assert client.client.hget(RUN_TENANTS, run_id) is None
    assert not client.client.exists(keys.run(tenant, run_id), keys.events(tenant, run_id))


def test_a_budget_pair_without_an_equals_sign_is_a_usage_error(redis_url: str) -> None:
    """`--budget max_steps` is refused before connecting: one line, exit 2."""
    result = submit("redis://127.0.0.1:1/0", "t", "--job", "support", "--budget", "max_steps")
    assert result.exit_code == 2, result.output
    assert result.stderr == "error: --budget: expected KEY=VALUE, got 'max_steps'\n"
