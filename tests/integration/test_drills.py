"""Failure drills (kill the worker, hang a tool or the model) only where they are turned on:
a submission asking for one is refused elsewhere, and a worker without them ignores them."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from tests.integration.workers import client_for, running_workers, settled, wait_until
from turnstile.errors import SubmissionError
from turnstile.jobs.support.scenarios import GOAL, USER
from turnstile.worker.cli.main import app
from turnstile.worker.store import keys

pytestmark = pytest.mark.integration

DRILLS = [{"die_in": "get_order"}, {"model_sleep_s": 3600}, {"sleep_s": {"get_order": 600}}]


@pytest.mark.parametrize("drill", DRILLS, ids=lambda d: next(iter(d)))
def test_a_drill_is_refused_where_drills_are_off(
    redis_url: str, unique: str, drill: dict[str, object]
) -> None:
    """Without TURNSTILE_ALLOW_DRILLS a submission asking for a drill is refused with one line
    naming it, through the client and the CLI, and no run is written."""
    client = client_for(redis_url, allow_drills=False)
    tenant, run_id = f"t-{unique}", f"run_{unique}"
    with pytest.raises(SubmissionError, match="failure drills are off"):
        client.submit(tenant, USER, "support", GOAL, drill, run_id=run_id)
    ((name, value),) = drill.items()
    param = f"{name}={value}".replace("'", '"')
    result = CliRunner().invoke(
        app,
        ["submit", "--job", "support", "--tenant", tenant, "--user", USER, "--goal", GOAL,
         "--run-id", run_id, "--param", param],
        env={"TURNSTILE_REDIS_URL": redis_url, "TURNSTILE_ALLOW_DRILLS": "0"},
    )  # fmt: skip
    assert result.exit_code == 1, result.output
    assert result.stderr.count("\n") == 1 and name in result.stderr, result.stderr
    assert not client.client.exists(keys.run(tenant, run_id))


def test_a_worker_without_drills_never_executes_them(redis_url: str, unique: str) -> None:
    """A run that carries a kill drill and a hang drill (submitted where drills are on) runs on
    a worker with drills off as if it had none: it completes, and no pool process dies."""
    queue = f"nodrill-{unique}"
    with running_workers(redis_url, [queue], 1, env={"TURNSTILE_ALLOW_DRILLS": "0"}) as (w,):
        client = client_for(redis_url)  # drills on for this client, as on a staging box
        pool = {p.pid for p in w.children()}
        drills = {"die_in": "get_order", "model_sleep_s": 3600}
        run_id = client.submit(f"t-{unique}", USER, "support", GOAL, drills, queue=queue)
        wait_until(lambda: settled(client, [run_id]), timeout_s=30, what="the run ends")
        assert client.state(run_id).outcome == "completed"
        assert {p.pid for p in w.children()} == pool  # no pool process was killed
