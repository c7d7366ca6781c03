"""Micro-benchmark: one fair-share dispatcher pass (worker/scheduling/dispatcher.py) with room
for `--room` steps and a few to hundreds pending for one tenant, on a real server: the pass's
CPU in this process, and the take scripts (EVALSHA) the server ran for it.

    uv run python -m tests.bench.bench_dispatch_pass [--room 500] [--pending 5,50,400]
"""

from __future__ import annotations

import argparse
import time

from tests.integration.workers import client_for
from turnstile.jobs.support.scenarios import GOAL, USER
from turnstile.worker.dev.embedded import EmbeddedServer
from turnstile.worker.scheduling.dispatcher import Dispatcher
from turnstile.worker.settings import Settings


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--room", type=int, default=500, help="dispatch_depth: the pass's room")
    parser.add_argument("--pending", default="5,50,400", help="steps pending, per measure")
    args = parser.parse_args()
    counts = [int(n) for n in args.pending.split(",")]
    queues = [f"q{i}" for i in range(len(counts))]
    with EmbeddedServer() as server:
        client = client_for(server.url, submit_queues=",".join(queues))
        config = Settings(redis_url=server.url, dispatch_depth=args.room)
        dispatcher = Dispatcher(client.client, None, config, lambda batch: None)
        for queue, count in zip(queues, counts, strict=True):
            for _ in range(count):
                client.submit("bench", USER, "support", GOAL, {}, queue=queue)
            client.client.config_resetstat()
            started = time.process_time()
            sent = dispatcher.dispatch()
            spent_ms = (time.process_time() - started) * 1e3
            takes = client.client.info("commandstats").get("cmdstat_evalsha", {}).get("calls")
            print(f"pending {count}: sent {sent}, {spent_ms:.2f} ms CPU, {takes} EVALSHA")
        client.close()


if __name__ == "__main__":
    main()
