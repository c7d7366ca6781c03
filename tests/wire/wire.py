"""Start a provider wire-format server process for a test, and read back what it received."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).parent / "fixtures"
ROOT = Path(__file__).parents[2]

# The shipped price table's rates for the two models the fixtures use, written out here so the
# tests check the arithmetic instead of repeating it: (input, cached input, cache write, output)
# in micro-dollars per million tokens.
RATES = {
    "openai": (400_000, 100_000, 400_000, 1_600_000),  # openai:gpt-4.1-mini
    "anthropic": (3_000_000, 300_000, 3_750_000, 15_000_000),  # anthropic:claude-sonnet-4-6
}
MODELS = {"openai": "openai:gpt-4.1-mini", "anthropic": "anthropic:claude-sonnet-4-6"}


def exchanges(provider: str, scenario: str) -> list[dict[str, Any]]:
    data: list[dict[str, Any]] = json.loads((FIXTURES / provider / f"{scenario}.json").read_text())
    return data


@dataclass
class Wire:
    provider: str
    scenario: str
    port: int

    @property
    def base_url(self) -> str:
        """The server's URL as its format's SDK takes it (OpenAI's ends in /v1)."""
        root = f"http://127.0.0.1:{self.port}"
        return f"{root}/v1" if self.provider == "openai" else root

    @property
    def env(self) -> dict[str, str]:
        """The SDK's own variables, pointing at this server."""
        if self.provider == "openai":
            return {
                "OPENAI_BASE_URL": f"http://127.0.0.1:{self.port}/v1",
                "OPENAI_API_KEY": "sk-test",
            }
        return {
            "ANTHROPIC_BASE_URL": f"http://127.0.0.1:{self.port}",
            "ANTHROPIC_API_KEY": "sk-ant-test",
        }

    def received(self) -> list[dict[str, Any]]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/_requests", timeout=5) as r:
            data: list[dict[str, Any]] = json.loads(r.read())
        return data

    def billed(self, count: int | None = None) -> tuple[int, int]:
        """(tokens, cost in micro-dollars) of the usage in the answers the server gave in full,
        at the price table's rates, each call rounded up to a whole micro-dollar."""
        plain_rate, cached_rate, write_rate, out_rate = RATES[self.provider]
        tokens = cost = 0
        answered = exchanges(self.provider, self.scenario)[: len(self.received())]
        for exchange in answered[:count]:
            # A cut reply or a stream spoilt half-way never gave its usage to the client.
            spoilt = exchange.get("cut") or exchange.get("malformed")
            delivered = exchange["status"] == 200 and not spoilt
            usage = exchange["body"].get("usage") if delivered else None
            if not usage:
                continue
            if self.provider == "openai":
                cached, written = usage["prompt_tokens_details"]["cached_tokens"], 0
                total_in, out = usage["prompt_tokens"], usage["completion_tokens"]
            else:
                cached = usage["cache_read_input_tokens"]
                written = usage["cache_creation_input_tokens"]
                total_in = usage["input_tokens"] + cached + written
                out = usage["output_tokens"]
            tokens += total_in + out
            micro = (
                (total_in - cached - written) * plain_rate
                + cached * cached_rate
                + written * write_rate
                + out * out_rate
            )
            cost += math.ceil(micro / 1_000_000)
        return tokens, cost


@contextmanager
def wire_server(
    provider: str, scenario: str = "", *, delay_s: float = 0.0, by_turn: bool = False,
    script: dict[str, Any] | list[dict[str, Any]] | None = None,
    chunk_delay_s: float = 0.0,
) -> Iterator[Wire]:  # fmt: skip
    """The provider's endpoint answering the scenario's exchanges, each after `delay_s`; with
    `by_turn`, each request gets its run's turn's exchange (many runs at once). A `script`
    object instead of a scenario: `{"agent": {...}}` (any job's tools, see agent.py) or
    `{"always": exchange}`, or a list of exchanges like a scenario's. A request that asks to
    stream is answered in the format's streaming wire format (streaming.py), each frame
    `chunk_delay_s` after the one before."""
    if script is not None:
        with tempfile.TemporaryDirectory(prefix="turnstile-wire-") as folder:
            path = Path(folder) / "script.json"
            path.write_text(json.dumps(script))
            with _serving(
                provider, scenario, path, delay_s, by_turn, chunk_delay_s=chunk_delay_s
            ) as wire:
                yield wire
        return
    fixture = FIXTURES / provider / f"{scenario}.json"
    with _serving(
        provider, scenario, fixture, delay_s, by_turn, chunk_delay_s=chunk_delay_s
    ) as wire:
        yield wire


def down(status: int = 503) -> dict[str, Any]:
    """A provider answering every request with `status`, asking for no wait before a retry."""
    body = {"error": {"message": "the service is unavailable", "type": "server_error"}}
    return {"always": {"status": status, "headers": {"retry-after-ms": "0"}, "body": body}}


@contextmanager
def _serving(
    provider: str,
    scenario: str,
    script: Path,
    delay_s: float,
    by_turn: bool,
    *,
    chunk_delay_s: float = 0.0,
) -> Iterator[Wire]:
    mode = ["by-turn" if by_turn else "in-order", str(chunk_delay_s)]
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.wire.wire_server", str(script), str(delay_s), *mode],
        cwd=ROOT,
        stdout=subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        port = int(process.stdout.readline())
        yield Wire(provider, scenario, port)
    finally:
        process.terminate()
        process.wait(10)
        if process.stdout is not None:
            process.stdout.close()


@dataclass
class Receiver:
    port: int

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def spans(self) -> list[dict[str, Any]]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/_spans", timeout=5) as r:
            data: list[dict[str, Any]] = json.loads(r.read())
        return data


@contextmanager
def otlp_receiver() -> Iterator[Receiver]:
    """An OTLP/HTTP receiver process decoding the protobuf export requests it is sent."""
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.wire.otlp_receiver"], cwd=ROOT, stdout=subprocess.PIPE
    )
    try:
        assert process.stdout is not None
        yield Receiver(int(process.stdout.readline()))
    finally:
        process.terminate()
        process.wait(10)
        if process.stdout is not None:
            process.stdout.close()
