"""Micro-benchmark: the client CPU one model call costs, our provider adapter (OpenAI and
Anthropic) against tests/wire/'s server at zero latency, in one process, no worker.

    uv run python -m tests.bench.bench_model_call [--calls 2000] [--rounds 3]
        [--providers openai,anthropic] [--stream] [--greenlets 0] [--trees before=DIR,after=.]

Each round runs every tree's adapter in a child process of its own (the tree's .venv python,
so `turnstile` is that checkout's), one after the other, against the same wire servers: `calls`
calls of a support-job turn (its tools, a view, the previous turn's call and its result), after
a warm-up; with --greenlets N, on gevent, N calls at once as a green worker makes them. Per
tree and provider: the child's CPU (time.process_time) per call in microseconds, median and
spread over the rounds, and wall time per call. The wire server's CPU is not counted in the
client's figure; its CPU per call (warm-up included) is shown beside it, but reads as noisy.
Without --trees the one tree is this checkout.
"""

# ruff: noqa: PLC0415 - a child imports the adapters after gevent's monkey patch, not before

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

import psutil

THIS = Path(__file__).resolve()
ROOT = THIS.parents[2]
WARM_UP = 200


def _request(stream: bool) -> Any:
    from turnstile.jobs.live import NO_LIVE
    from turnstile.jobs.model import ModelRequest
    from turnstile.jobs.state import Call
    from turnstile.jobs.support.job import support_job
    from turnstile.jobs.support.shop import InMemoryShop

    job = support_job(InMemoryShop())
    view = json.dumps(
        {
            "goal": "Customer says order A-1001 arrived broken and wants a refund.",
            "user": "u-42",
            "plan": [{"id": f"s{i}", "tool": "get_order", "done": i < 2} for i in range(4)],
            "observations": [{"order": "A-1001", "total_cents": 4599, "items": ["mug"] * 3}],
        }
    )
    live: Any = NO_LIVE
    if stream:

        class _Live:
            on = True

            def text(self, words: str) -> None:
                pass

            def abandon(self, why: str) -> None:
                pass

        live = _Live()
    return ModelRequest(
        view, 1024, 600.0, 3, tools=job.tool_specs,
        previous_calls=(Call(name="get_order", args={"order_id": "A-1001"}),),
        last_result={"status": "ok", "order": {"id": "A-1001", "total_cents": 4599}},
        live=live,
    )  # fmt: skip


def _model(provider: str, base_url: str) -> Any:
    from turnstile.providers.endpoints import Route

    route = Route(provider, provider, base_url, None, "BENCH_KEY", {}, key="sk-bench")
    if provider == "openai":
        from turnstile.providers.openai_chat import OpenAIChat

        return OpenAIChat("gpt-4.1-mini", None, route=route)
    from turnstile.providers.anthropic_messages import AnthropicMessages

    return AnthropicMessages("claude-sonnet-4-6", None, route=route)


def child(provider: str, base_url: str, calls: int, stream: bool, greenlets: int) -> None:
    """Run in a tree's own python: `calls` calls, printing CPU and wall time per call (us);
    with `greenlets`, on gevent (monkey-patched, as a green worker is), that many at once."""
    if greenlets:
        from gevent import monkey

        monkey.patch_all()
    model, request = _model(provider, base_url), _request(stream)

    def calling(count: int) -> None:
        for _ in range(count):
            model.next(request)

    def at_once(count: int) -> None:
        if not greenlets:
            calling(count)
            return
        import gevent

        gevent.joinall([gevent.spawn(calling, count // greenlets) for _ in range(greenlets)])

    at_once(WARM_UP)
    cpu, wall = time.process_time(), time.perf_counter()
    at_once(calls)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    print(json.dumps({"cpu_us": cpu / calls * 1e6, "wall_us": wall / calls * 1e6}))


def _trees(spec: str) -> dict[str, Path]:
    if not spec:
        return {"this": ROOT}
    out = {}
    for entry in (e.strip() for e in spec.split(",") if e.strip()):
        name, _, folder = entry.partition("=")
        out[name] = Path(folder).resolve()
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--providers", default="openai,anthropic")
    parser.add_argument("--stream", action="store_true")
    parser.add_argument("--trees", default="")
    parser.add_argument("--greenlets", type=int, default=0, help="0: plain threads, no gevent")
    parser.add_argument("--child", nargs=2, metavar=("PROVIDER", "BASE_URL"))
    args = parser.parse_args()
    if args.child:
        child(args.child[0], args.child[1], args.calls, args.stream, args.greenlets)
        return

    from contextlib import ExitStack

    from tests.wire.wire import exchanges, wire_server

    trees = _trees(args.trees)
    providers = [p.strip() for p in args.providers.split(",") if p.strip()]
    figures: dict[tuple[str, str], list[dict[str, float]]] = {}
    with ExitStack() as stack:
        urls, servers = {}, {}
        for provider in providers:
            first = exchanges(provider, "support_run")[0]
            before = {p.pid for p in psutil.Process().children()}
            wire = stack.enter_context(wire_server(provider, script={"always": first}))
            urls[provider] = wire.base_url
            (servers[provider],) = [p for p in psutil.Process().children() if p.pid not in before]
        for _ in range(args.rounds):
            for provider in providers:
                for name, tree in trees.items():
                    command = [
                        str(tree / ".venv" / "bin" / "python"), str(THIS), "--calls",
                        str(args.calls), "--child", provider, urls[provider],
                        "--greenlets", str(args.greenlets), *(["--stream"] if args.stream else []),
                    ]  # fmt: skip
                    served = _cpu_s(servers[provider])
                    out = subprocess.run(
                        command, cwd=tree, check=True, capture_output=True, text=True
                    ).stdout
                    row = json.loads(out.strip().splitlines()[-1])
                    time.sleep(0.3)  # the server's threads for the child's connections end
                    served = _cpu_s(servers[provider]) - served
                    row["server_us"] = served / (args.calls + WARM_UP) * 1e6
                    figures.setdefault((provider, name), []).append(row)
    print(
        f"{'provider':<10} {'tree':<8} {'client cpu us/call (median, min-max)':<38}"
        " server cpu us/call  wall us/call"
    )
    for (provider, name), rows in figures.items():
        cpu = [r["cpu_us"] for r in rows]
        spread = f"{statistics.median(cpu):7.0f} ({min(cpu):.0f}-{max(cpu):.0f})"
        server = statistics.median(r["server_us"] for r in rows)
        wall = statistics.median(r["wall_us"] for r in rows)
        print(f"{provider:<10} {name:<8} {spread:<38} {server:18.0f} {wall:13.0f}")


def _cpu_s(process: psutil.Process) -> float:
    times = process.cpu_times()
    return float(times.user + times.system)


if __name__ == "__main__":
    main()
