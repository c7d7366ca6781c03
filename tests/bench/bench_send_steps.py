"""Micro-benchmark: the fair-share dispatcher's batch send (worker/broker/producer.py
`send_steps`) to a real server, in microseconds per step (the batch's round trip included).

    uv run python -m tests.bench.bench_send_steps [--batch 16] [--batches 300] [--rounds 3]
"""

from __future__ import annotations

import argparse
import time

from turnstile.worker.broker import producer
from turnstile.worker.broker.app import make_app
from turnstile.worker.broker.message import StepMessage
from turnstile.worker.dev.embedded import EmbeddedServer
from turnstile.worker.settings import Settings


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--batches", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with EmbeddedServer() as server:
        app = make_app(Settings(redis_url=server.url))
        batch = [(StepMessage("t", f"run{n}", 2, "default"), 60.0, 120.0)
                 for n in range(args.batch)]  # fmt: skip
        producer.send_steps(app, batch)  # the connection and the queue's declaration
        for _ in range(args.rounds):
            started = time.perf_counter()
            for _ in range(args.batches):
                producer.send_steps(app, batch)
            spent = time.perf_counter() - started
            print(f"{spent / (args.batches * args.batch) * 1e6:.1f} us per step")


if __name__ == "__main__":
    main()
