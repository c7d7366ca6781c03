"""How the operator commands are mounted: the store's options declared once and listed last,
and a command's own usage errors said before the store is asked for."""

from __future__ import annotations

import pytest
from typer.main import get_command
from typer.testing import CliRunner

from turnstile.worker.cli.main import app

OPERATOR_COMMANDS = ("pause", "resume", "drain", "queues", "approve", "deny", "cancel", "runs",
                     "status", "watch", "trace", "replay")  # fmt: skip
runner = CliRunner()


def test_every_operator_command_ends_with_the_store_options() -> None:
    """Each operator command's last options are --redis-url and --broker-url, read from
    TURNSTILE_REDIS_URL and TURNSTILE_BROKER_URL, and pause and resume take --queue and
    --tenant from the control variables."""
    commands = get_command(app).commands  # type: ignore[attr-defined]
    for name in OPERATOR_COMMANDS:
        params = commands[name].params
        assert [(p.name, p.envvar) for p in params][-2:] == [
            ("redis_url", "TURNSTILE_REDIS_URL"), ("broker_url", "TURNSTILE_BROKER_URL"),
        ], name  # fmt: skip
    for name in ("pause", "resume"):
        assert [(p.name, p.envvar) for p in commands[name].params][:2] == [
            ("queue", "TURNSTILE_CONTROL_QUEUE"), ("tenant", "TURNSTILE_CONTROL_TENANT"),
        ], name  # fmt: skip


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["pause"], "give exactly one of --queue or --tenant"),
        (["resume", "--queue", "q", "--tenant", "t"], "give exactly one of --queue or --tenant"),
        (["drain", "--queue", "q", "--timeout-s", "3"], "--timeout-s applies only with --wait"),
    ],
)
def test_a_usage_error_comes_before_a_missing_store(args: list[str], said: str) -> None:
    """With no store configured, a command's own usage error is what it says (exit 2), not
    that the store is missing: the store is connected only when the command first uses it."""
    result = runner.invoke(app, args, env={"TURNSTILE_REDIS_URL": ""})
    assert result.exit_code == 2
    assert result.output == f"error: {said}\n"
