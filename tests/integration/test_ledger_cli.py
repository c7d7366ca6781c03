"""`turnstile ledger set|show`: thin commands, one-line errors, JSON on demand."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from turnstile.ledger import Ledger
from turnstile.ledger.cli import ledger_app
from turnstile.worker.cli.main import app

pytestmark = pytest.mark.integration

runner = CliRunner()


def test_set_then_show_as_json(redis_url: str, unique: str) -> None:
    """`set` writes hard or soft ceilings with a period; `show --json` reports every field."""
    env = {"TURNSTILE_REDIS_URL": redis_url}
    result = runner.invoke(
        ledger_app, ["set", unique, "cost_microusd=100000000", "--period", "day"], env=env
    )
    assert result.exit_code == 0, result.output
    result = runner.invoke(ledger_app, ["set", unique, "tokens=5000", "--soft"], env=env)
    assert result.exit_code == 0, result.output
    with Ledger.from_url(redis_url) as ledger:
        ledger.reserve(unique, "r", {"tokens": 7}, timeout_s=60)

    result = runner.invoke(ledger_app, ["show", unique, "--json"], env=env)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {
        "tokens": {
            "ceiling": 5000,
            "committed": 0,
            "reserved": 7,
            "hard": False,
            "period": "none",
        },
        "cost_microusd": {
            "ceiling": 100000000,
            "committed": 0,
            "reserved": 0,
            "hard": True,
            "period": "day",
        },
    }


def test_show_prints_a_table_through_the_main_command(redis_url: str, unique: str) -> None:
    """`turnstile ledger show` is mounted on the main command and prints a table."""
    with Ledger.from_url(redis_url) as ledger:
        ledger.set_ceiling(unique, "steps", 40)
    result = runner.invoke(app, ["ledger", "show", unique, "--redis-url", redis_url])
    assert result.exit_code == 0, result.output
    assert "steps" in result.stdout and "40" in result.stdout


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["set", "t", "bogus=1"], 1, "unknown dimension 'bogus'"),
        (["set", "t", "tokens=-1"], 2, "expected DIMENSION=INTEGER"),
        (["set", "t", "tokens"], 2, "expected DIMENSION=INTEGER"),
        (["set", "a{b", "tokens=1"], 1, "bad tenant"),
        (["show", "t", "--redis-url", "redis://127.0.0.1:1/0"], 1, "unavailable"),
        (["show", "t", "--redis-url", "nonsense://x"], 2, "bad ledger store URL"),
    ],
)
def test_errors_are_one_line_and_a_non_zero_exit(
    redis_url: str, args: list[str], code: int, message: str
) -> None:
    """A bad argument or an unreachable store gives one clear line, never a traceback."""
    result = runner.invoke(ledger_app, args, env={"TURNSTILE_REDIS_URL": redis_url})
    assert result.exit_code == code
    assert result.stderr.startswith("error: ") and message in result.stderr
    assert result.stderr.count("\n") == 1
    assert "Traceback" not in result.output


def test_without_a_store_url_it_says_so_and_exits_2() -> None:
    """With neither TURNSTILE_REDIS_URL nor --redis-url the command explains what is missing."""
    result = runner.invoke(ledger_app, ["show", "t"], env={"TURNSTILE_REDIS_URL": ""})
    assert result.exit_code == 2
    assert "TURNSTILE_REDIS_URL" in result.stderr
