"""Benchmark: what live output costs and how fast it arrives (issue 33).

    uv run python -m tests.bench.bench_live [--runs 300] [--rounds 2] [--concurrency 100]
        [--latency-runs 5] [--answer-chars 600] [--chunk-delay-s 0.02]

1. Turns/s with live output on against off: the support job on tests/wire/'s OpenAI
   wire-format server at zero latency, which streams its replies in chunks when asked and
   answers whole when not; one gevent worker process of `--concurrency` turns in flight,
   `--runs` runs at once. Three modes: off; on with nobody reading the runs live (a turn then
   streams nothing: one EXISTS); on with every run read live from its submission (every call
   streamed, the words and tool events written). The modes run in turn, their order reversed
   round by round, on fresh servers, and the ratios are taken per round. Goal: on/off >= 0.9.
2. From the provider sending a chunk to an SSE client receiving its words: one worker, the
   HTTP API, a client following each run with `GET /v1/runs/{id}/events?live=1` from its
   submission, and a final answer of `--answer-chars` characters streamed a chunk (8
   characters) every `--chunk-delay-s`. Each chunk's send time is the wire server's, each
   word's arrival the client's, both on this machine's wall clock; p50 and p99 over every
   chunk that carried words. Goal: p50 <= 50 ms.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import threading
import time
import uuid
from typing import Any

import httpx

from tests.bench.bench_latency import measure
from tests.integration.apiserver import http, make_key, running_api
from tests.integration.workers import WorkerProcess, client_for
from tests.wire.streaming import PIECE_CHARS
from tests.wire.wire import MODELS, exchanges, wire_server
from turnstile.jobs.support.scenarios import GOAL, USER
from turnstile.providers.contract import AnswerText
from turnstile.worker.dev.embedded import EmbeddedServer
from turnstile.worker.store import keys

BUDGET = {"max_tokens": 40_000, "max_tool_calls": 8}
ROLE_AND_CALL_FRAMES = 2  # the role chunk and the call's name chunk come before its arguments


def read_live(client: Any, tenant: str, run_id: str) -> None:
    """The run read live from its submission on, as far as its worker can tell: the key each
    reader sets (store/live.py), set here for the whole bench instead of by 300 readers."""
    client.client.set(keys.live_readers(tenant, run_id), "1", ex=3600)


MODES = {
    "off": ({"TURNSTILE_LIVE_OUTPUT": "0"}, None),
    "on, unread": ({"TURNSTILE_LIVE_OUTPUT": "1"}, None),
    "on, read": ({"TURNSTILE_LIVE_OUTPUT": "1"}, read_live),
}


def throughput(args: argparse.Namespace) -> None:
    ratios: dict[str, list[float]] = {"on, unread": [], "on, read": []}
    for round_ in range(args.rounds):
        rates = {}
        order = list(MODES) if round_ % 2 == 0 else list(reversed(MODES))
        for mode in order:
            extra, submitted = MODES[mode]
            figures = measure("gevent", 1, args.concurrency, 0.0, args.runs, extra=extra,
                              submitted=submitted)  # fmt: skip
            rates[mode] = figures.turns_per_s
            print(json.dumps({"mode": mode, **figures.__dict__}), flush=True)
        for mode, got in ratios.items():
            got.append(rates[mode] / rates["off"])
        print(f"round {round_ + 1}: turns/s over live output off: "
              + ", ".join(f"{mode} {got[-1]:.2f}" for mode, got in ratios.items()))  # fmt: skip
    for mode, got in ratios.items():
        print(f"{mode} / off per round: {', '.join(f'{r:.2f}' for r in got)} (goal >= 0.9)")


def long_answer_script(chars: int, chunk_delay_s: float) -> list[dict[str, Any]]:
    """The support run's exchanges, the final answer `chars` long and streamed slowly."""
    script = copy.deepcopy(exchanges("openai", "support_run"))
    final = script[-1]
    words = "Your refund of $30.00 is on its way and we emailed you the confirmation. " * 50
    answer = words[:chars].strip()
    call = final["body"]["choices"][0]["message"]["tool_calls"][0]["function"]
    call["arguments"] = json.dumps({"outcome": "completed", "text": answer})
    final["chunk_delay_s"] = chunk_delay_s
    return script


def words_at(arguments: str) -> list[int]:
    """For each argument piece the wire server sends, the answer's length once it arrived."""
    answer, seen, out = AnswerText(), 0, []
    for at in range(PIECE_CHARS, len(arguments) + PIECE_CHARS, PIECE_CHARS):
        seen += len(answer.feed("final_answer", arguments[:at]))
        out.append(seen)
    return out


def follow(web: httpx.Client, run_id: str) -> list[tuple[float, int]]:
    """(arrival time, the final answer's length so far) of each text frame of the run."""
    got: list[tuple[float, int]] = []
    length, turn, data = 0, 0, ""
    path = f"/v1/runs/{run_id}/events?live=1"
    with web.stream("GET", path, timeout=120) as reply:
        for line in reply.iter_lines():
            if line.startswith("data:"):
                data = line[5:].strip()
            elif line == "" and data:
                event = json.loads(data)
                data = ""
                if event.get("type") == "finished" and not event.get("live"):
                    return got
                if event.get("type") != "text":
                    continue
                if event["turn"] != turn:
                    turn, length = event["turn"], 0
                length += len(event["text"])
                got.append((time.time(), length))
    return got


def latency(args: argparse.Namespace) -> None:
    script = long_answer_script(args.answer_chars, args.chunk_delay_s)
    arguments = script[-1]["body"]["choices"][0]["message"]["tool_calls"][0]["function"]
    lengths = words_at(arguments["arguments"])
    delays_ms: list[float] = []
    with (
        EmbeddedServer() as server,
        wire_server("openai", script=script, by_turn=True) as wire,
    ):
        queue, tenant = f"live-{uuid.uuid4().hex[:8]}", "bench"
        worker = WorkerProcess(server.url, [queue], name=f"live-{queue}", env=wire.env).start()
        try:
            worker.wait_ready()
            client = client_for(server.url)
            client.ledger.set_ceiling(tenant, "cost_microusd", 10**12)
            with running_api(server.url) as api, http(api, make_key(server.url, tenant)) as web:
                for _ in range(args.latency_runs):
                    before = len(wire.received())
                    run_id = client.submit(tenant, USER, "support", GOAL,
                                           {"model": MODELS["openai"]}, budget=BUDGET,
                                           queue=queue)  # fmt: skip
                    heard: list[list[tuple[float, int]]] = []
                    reader = threading.Thread(
                        target=lambda h=heard, r=run_id: h.append(follow(web, r))
                    )
                    reader.start()
                    reader.join(120)
                    final = wire.received()[before:][-1]
                    sent = final["sent"][ROLE_AND_CALL_FRAMES:]
                    arrived = heard[0] if heard else []
                    for sent_at, length, previous in zip(
                        sent, lengths, [0, *lengths], strict=False
                    ):
                        if length == previous:
                            continue  # a piece of the arguments before the text, or a cut escape
                        when = next((t for t, n in arrived if n >= length), None)
                        if when is not None:
                            delays_ms.append((when - sent_at) * 1000)
        finally:
            worker.stop(timeout_s=30)
    delays_ms.sort()
    p50 = statistics.median(delays_ms)
    p99 = delays_ms[min(len(delays_ms) - 1, int(len(delays_ms) * 0.99))]
    print(json.dumps({"chunks": len(delays_ms), "p50_ms": round(p50, 1), "p99_ms": round(p99, 1),
                      "max_ms": round(delays_ms[-1], 1)}))  # fmt: skip
    print(f"chunk sent -> SSE received: p50 {p50:.1f} ms, p99 {p99:.1f} ms (goal p50 <= 50 ms)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--latency-runs", type=int, default=5)
    parser.add_argument("--answer-chars", type=int, default=600)
    parser.add_argument("--chunk-delay-s", type=float, default=0.02)
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument("--skip-latency", action="store_true")
    args = parser.parse_args()
    if not args.skip_latency:
        latency(args)
    if not args.skip_throughput:
        throughput(args)


if __name__ == "__main__":
    main()
