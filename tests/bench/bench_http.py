"""Benchmark: submissions per second over the HTTP API against submissions per second through
the Python client, side by side on the same store and broker.

    uv run python -m tests.bench.bench_http [--runs 300] [--rounds 3] [--threads 4]

One `turnstile api` process (uvicorn) on a private server; no workers, so only the submit path
is timed (its steps wait on the broker). Each round times `runs` submits through
`worker.api.Client` in this process, then `runs` over HTTP from one connection, then `runs`
over HTTP from `threads` connections at once; the ratios are taken per round, so a noisy
machine skews both alike. An HTTP submit carries what the client's does plus parsing, the
key's lookup and the rate limit's script: the goal is a single-connection ratio of at least
0.3 (`turnstile submit`, a process per call, manages about one in 1.5 s).
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx

from tests.integration.apiserver import make_key, running_api
from tests.integration.workers import client_for
from turnstile.jobs.support.scenarios import GOAL, USER
from turnstile.worker.dev.embedded import EmbeddedServer


def _client_rate(redis_url: str, tenant: str, queue: str, runs: int) -> float:
    client = client_for(redis_url)
    started = time.perf_counter()
    for _ in range(runs):
        client.submit(tenant, USER, "support", GOAL, {}, queue=queue)
    return runs / (time.perf_counter() - started)


def _http_rate(url: str, key: str, queue: str, runs: int, threads: int) -> float:
    body = {"user": USER, "goal": GOAL, "job": "support", "queue": queue}
    clients = [
        httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=30)
        for _ in range(threads)
    ]

    def post(i: int) -> None:
        reply = clients[i % threads].post("/v1/runs", json=body)
        assert reply.status_code == 202, reply.text

    started = time.perf_counter()
    if threads == 1:
        for i in range(runs):
            post(i)
    else:
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(post, range(runs)))
    rate = runs / (time.perf_counter() - started)
    for c in clients:
        c.close()
    return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=4)
    args = parser.parse_args()
    with EmbeddedServer() as server:
        tenant, queue = f"bench-{uuid.uuid4().hex[:6]}", f"bench-{uuid.uuid4().hex[:6]}"
        key = make_key(server.url, tenant)
        env = {"TURNSTILE_API_SUBMITS_PER_WINDOW": "1000000"}
        with running_api(server.url, env) as api:
            _http_rate(api.url, key, queue, 20, 1)  # warm: imports, connections, scripts
            _client_rate(server.url, tenant, queue, 20)
            print(f"{'round':>5} {'client/s':>9} {'http/s':>8} {'http x' + str(args.threads):>9}"
                  f" {'ratio':>6} {'ratio x' + str(args.threads):>9}")  # fmt: skip
            ratios, wide = [], []
            for i in range(args.rounds):
                client = _client_rate(server.url, tenant, queue, args.runs)
                one = _http_rate(api.url, key, queue, args.runs, 1)
                many = _http_rate(api.url, key, queue, args.runs, args.threads)
                ratios.append(one / client)
                wide.append(many / client)
                print(f"{i + 1:>5} {client:>9.1f} {one:>8.1f} {many:>9.1f} {ratios[-1]:>6.2f}"
                      f" {wide[-1]:>9.2f}")  # fmt: skip
    print(f"median ratio, one connection {statistics.median(ratios):.2f} (goal >= 0.3); "
          f"{args.threads} connections {statistics.median(wide):.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
