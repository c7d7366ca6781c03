"""Measure: the path of one submission from `Client.submit` to its send, and of one turn from
`Step.run` to the store's commit, as the code runs them (issue 31).

    uv run python -m tests.bench.bench_paths

Both run in this process against an embedded Valkey server: the support job's first turn, fair
share on (the defaults). `sys.settrace` follows the calling thread from the entry until the
send (`scheduling/fair.py` `route`'s `send`) or the commit (`RunStore.commit`) returns, and
counts, over the frames of Turnstile's own modules (comprehension frames left out):
- stops: the distinct (module, function) entered;
- modules: the distinct modules among them;
- climbs: the calls that enter a module other than the caller's that the path had entered
  before (execution going back into a module it had left);
- entries: per module of the step's and the client's own packages, how many calls entered it
  from another module.
The tool calls run on the process's tool threads, which the trace does not follow; the
kernel's own turn is part of the path.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from turnstile.jobs.support.scenarios import GOAL, USER
from turnstile.worker.broker.message import StepMessage
from turnstile.worker.client import connect_client
from turnstile.worker.dev.embedded import EmbeddedServer
from turnstile.worker.registry import Registry
from turnstile.worker.runtime.services import build_services
from turnstile.worker.runtime.step import Step
from turnstile.worker.settings import Settings
from turnstile.worker.store.connect import connect

COMPREHENSIONS = frozenset({"<listcomp>", "<dictcomp>", "<setcomp>", "<genexpr>"})


@dataclass
class Path:
    """What one traced call went through, until the frame named by `until` returned."""

    until: tuple[str, str]  # (module, function) whose return ends the path
    stops: list[tuple[str, str]] = field(default_factory=list)
    modules: list[str] = field(default_factory=list)
    climbs: int = 0
    entries: dict[str, int] = field(default_factory=dict)  # module: calls into it from another
    _stack: list[str] = field(default_factory=list)
    done: bool = False

    def trace(self, frame: FrameType, event: str, arg: Any) -> Any:
        if self.done:
            return None
        module = str(frame.f_globals.get("__name__", ""))
        ours = module.startswith("turnstile.") and frame.f_code.co_name not in COMPREHENSIONS
        if event == "call" and ours:
            stop = (module, frame.f_code.co_qualname)
            if stop not in self.stops:
                self.stops.append(stop)
            caller = self._stack[-1] if self._stack else ""
            if module != caller:
                self.entries[module] = self.entries.get(module, 0) + 1
                self.climbs += module in self.modules
            if module not in self.modules:
                self.modules.append(module)
            self._stack.append(module)
            return self._local
        return self._local if ours else None

    def _local(self, frame: FrameType, event: str, arg: Any) -> Any:
        if event == "return":
            if self._stack:
                self._stack.pop()
            if (frame.f_globals.get("__name__"), frame.f_code.co_qualname) == self.until:
                self.done = True
        return self._local

    def follow(self, call: Callable[[], Any]) -> Any:
        sys.settrace(self.trace)
        try:
            return call()
        finally:
            sys.settrace(None)

    def figures(self) -> dict[str, Any]:
        own = ("turnstile.worker.runtime.", "turnstile.worker.client.")
        return {
            "stops": len(self.stops), "modules": len(self.modules), "climbs": self.climbs,
            "entries": {m: n for m, n in self.entries.items() if m.startswith(own)},
        }  # fmt: skip


def measure() -> dict[str, Any]:
    with EmbeddedServer() as server:
        config = Settings(redis_url=server.url)
        client = connect_client(config)
        submit = Path(until=("turnstile.worker.scheduling.fair", "route.<locals>.send"))
        run_id = submit.follow(lambda: client.submit("bench", USER, "support", GOAL))
        store_client = connect(server.url, config)
        services = build_services(
            config, store_client, Registry(store_client), lambda msg, soft_s, hard_s: None
        )
        step = Step(services, StepMessage("bench", run_id, 1, "default"))
        turn = Path(until=("turnstile.worker.store.runs", "RunStore.commit"))
        result = turn.follow(step.run)
        client.close()
        store_client.close()
    return {
        "submit": submit.figures(),
        "step": {**turn.figures(), "result": str(result)},
        "submit_modules": submit.modules,
        "step_modules": turn.modules,
    }


if __name__ == "__main__":
    print(json.dumps(measure(), indent=2))
