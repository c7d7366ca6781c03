"""Benchmark: how fast the console's pages load with 10,000 runs stored.

    uv run python -m tests.bench.bench_console [--runs 10000] [--held 50] [--samples 15]

One private Valkey server and one `turnstile api` process; no workers. The runs are created
through the client (stored, their first steps left waiting), most of them then ended by the
store, and `--held` of them suspended holding a refund for approval (the state a worker would
commit, written through the store's own commit). For the runs page (an operator's, every
tenant, newest first), one run's page and the approvals inbox, it prints the time to first
byte (an HTTP client with the session's cookie, median and 95th percentile of `--samples`)
and, in headless Chromium (/usr/bin/chromium), the navigation's responseStart,
DOMContentLoaded and load (median), each from the start of the navigation.
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
from playwright.sync_api import sync_playwright

from tests.integration import apiserver
from tests.integration.apiserver import make_key, running_api
from tests.integration.workers import client_for
from turnstile.jobs.outcomes import Outcome, Status
from turnstile.jobs.state import RunState
from turnstile.jobs.support.scenarios import BY_LETTER, GOAL, USER, run_scenario
from turnstile.worker.client._client import Client
from turnstile.worker.dev.embedded import EmbeddedServer
from turnstile.worker.http.apikeys import Role
from turnstile.worker.store.runs import Change

CHROMIUM = "/usr/bin/chromium"
NAVIGATION = """() => {
  const n = performance.getEntriesByType('navigation')[0];
  return [n.responseStart, n.domContentLoadedEventEnd, n.loadEventEnd];
}"""


def _store_runs(client: Client, tenants: list[str], runs: int, held: int, queue: str) -> list[str]:
    """`runs` runs over the tenants, stored from a few threads: `held` suspended with a
    refund held, a tenth left running, the rest ended by the store."""
    held_state = run_scenario(BY_LETTER["G"]).state  # suspended, holding issue_refund
    assert held_state.pending is not None

    def one(i: int) -> str:
        tenant = tenants[i % len(tenants)]
        run_id = client.submit(tenant, USER, "support", GOAL, {}, queue=queue)
        if i < held:
            stored = client.store.hash(tenant, run_id)
            state = RunState.from_json(stored["state"])
            state.status, state.outcome = Status.SUSPENDED, Outcome.NEEDS_APPROVAL
            state.pending = held_state.pending
            done = client.store.commit(
                Change(
                    tenant=tenant, run_id=run_id, version=int(stored["version"]),
                    old_status="running", status="suspended", state_json=state.to_json().decode(),
                    outcome="needs_approval", hold="-",
                )
            )  # fmt: skip
            assert done.kind == "ok", done
        elif i % 10:
            client.store.fail_run(tenant, run_id, "ended for the benchmark")
        return run_id

    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(one, range(runs)))


def _ttfb(http: httpx.Client, url: str, samples: int) -> list[float]:
    out = []
    for _ in range(samples):
        started = time.perf_counter()
        with http.stream("GET", url) as reply:
            out.append((time.perf_counter() - started) * 1000)
            assert reply.status_code == 200, url
            reply.read()
    return out


def _browser(page: Any, url: str, samples: int) -> list[list[float]]:
    out = []
    for _ in range(samples):
        page.goto(url, wait_until="load")
        out.append(page.evaluate(NAVIGATION))
    return out


def _ms(values: list[float]) -> str:
    return f"{statistics.median(values):7.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--held", type=int, default=50)
    parser.add_argument("--samples", type=int, default=15)
    args = parser.parse_args()
    apiserver.READY_TIMEOUT_S = 180  # a loaded machine starts the server slowly; not timed
    with EmbeddedServer() as server:
        client = client_for(server.url)
        tenants = [f"bench-{uuid.uuid4().hex[:6]}" for _ in range(2)]
        started = time.perf_counter()
        ids = _store_runs(client, tenants, args.runs, args.held, f"q-{uuid.uuid4().hex[:6]}")
        print(f"stored {len(ids)} runs ({args.held} held) in {time.perf_counter() - started:.1f} s")
        key = make_key(server.url, "ops", Role.OPERATOR)
        with running_api(server.url) as api, sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, headless=True)
            page = browser.new_page()
            page.goto(f"{api.url}/console/login")
            page.fill("input[name=key]", key)
            with page.expect_navigation():
                page.click("form.login button")
            cookies = {c["name"]: c["value"] for c in page.context.cookies()}
            pages = {
                "runs (every tenant)": "/console/runs",
                "runs (stopped, one tenant)": f"/console/runs?tenant={tenants[0]}&status=stopped",
                "a run": f"/console/runs/{ids[-1]}",
                "approvals inbox": "/console/inbox",
            }
            print(f"{'page':<28} {'ttfb ms':>8} {'p95':>7} {'resp ms':>8} {'DCL ms':>8} "
                  f"{'load ms':>8} {'bytes':>8}")  # fmt: skip
            with httpx.Client(base_url=api.url, cookies=cookies, timeout=60) as http:
                for name, path in pages.items():
                    size = len(http.get(path).content)  # warm: the first read of each page
                    ttfb = _ttfb(http, path, args.samples)
                    nav = _browser(page, f"{api.url}{path}", args.samples)
                    p95 = sorted(ttfb)[max(0, int(len(ttfb) * 0.95) - 1)]
                    print(f"{name:<28} {_ms(ttfb):>8} {p95:7.1f} {_ms([n[0] for n in nav]):>8} "
                          f"{_ms([n[1] for n in nav]):>8} {_ms([n[2] for n in nav]):>8} "
                          f"{size:>8}")  # fmt: skip
            browser.close()
        client.close()


if __name__ == "__main__":
    main()
