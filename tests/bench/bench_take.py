"""Micro-benchmark: the guarded Redis transport's take (worker/broker/transport.py, TAKE_MOST)
at several sizes side by side, in one process on a real server: a consumer with a prefetch of
1,000 drains a queue, acking each message as it is handed over; CPU and wall time per message.

    uv run python -m tests.bench.bench_take [--most 8,16,32,64] [--messages 4000] [--rounds 2]
"""

from __future__ import annotations

import argparse
import time
import uuid
from typing import Any

from kombu import Connection, Consumer, Exchange, Producer, Queue

from turnstile.worker.broker import transport
from turnstile.worker.dev.embedded import EmbeddedServer

PREFETCH = 1000
BODY_PAD = "x" * 400  # about a step message's size


def _drain(url: str, messages: int) -> tuple[float, float]:
    name = f"take-{uuid.uuid4().hex[:8]}"
    queue = Queue(name, Exchange(name, type="direct"), routing_key=name)
    got = [0]

    def handled(body: Any, message: Any) -> None:
        got[0] += 1
        message.ack()

    with Connection(url, transport=transport.Transport) as conn:
        producer = Producer(conn.default_channel)
        for n in range(messages):
            producer.publish({"n": n, "pad": BODY_PAD}, exchange=queue.exchange,
                             routing_key=name, declare=[queue])  # fmt: skip
        consumer = Consumer(conn.default_channel, [queue], callbacks=[handled])
        consumer.qos(prefetch_count=PREFETCH)
        consumer.consume()
        conn.drain_events(timeout=2)  # the first read may load the script
        got[0] = 0
        cpu, wall = time.process_time(), time.perf_counter()
        while got[0] < messages - PREFETCH // 5:
            conn.drain_events(timeout=2)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        consumer.cancel()
    return cpu / got[0] * 1e6, wall / got[0] * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--most", default="8,16,32,64")
    parser.add_argument("--messages", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    with EmbeddedServer() as server:
        for _ in range(args.rounds):
            for most in (int(n) for n in args.most.split(",")):
                transport.TAKE_MOST = most
                cpu_us, wall_us = _drain(server.url, args.messages)
                print(f"TAKE_MOST={most}: {cpu_us:.1f} us CPU, {wall_us:.1f} us wall per message")


if __name__ == "__main__":
    main()
