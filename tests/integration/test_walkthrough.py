"""The first-job walkthrough (docs/first-job.md) run as written, so it cannot rot.

Its blocks are read from the page in order: a ```python block after `<!-- file: NAME -->` is
saved as NAME; each ```sh block runs in one bash session, as the page's terminals would (the
store's and the worker's blocks, whose commands run until stopped, as background jobs of that
session); a ```text block after `<!-- output -->` must be what the block before it printed
(`...` stands for anything), after `<!-- output: last line -->` its last line. The only
changes to the page's text: the store's port is a free one (`--port`, and `:6379` in the URLs)
and HOME is the test's folder. The provider of the page's last section is the wire-format
server of tests/wire, named by OPENAI_BASE_URL in the session's environment from the start,
as a newcomer's profile would have their key.
"""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

from tests.integration.workers import client_for, wait_until
from tests.wire.wire import wire_server
from turnstile.worker.dev.embedded import free_port

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "first-job.md"
LONG_RUNNING = ("turnstile dev-server", "turnstile worker")  # run until stopped
BLOCK_TIMEOUT_S = 180.0
READY_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Block:
    """A fenced block of the page: its language, its text and the marker before it."""

    lang: str
    text: str
    marker: str
    line: int


def page_blocks(text: str) -> list[Block]:
    pattern = re.compile(r"(?:^<!-- (?P<marker>[^>]*?) -->\n)?^```(?P<lang>\w*)\n(?P<body>.*?)^```",
                         re.M | re.S)  # fmt: skip
    return [
        Block(m["lang"], m["body"], m["marker"] or "", text.count("\n", 0, m.start()) + 1)
        for m in pattern.finditer(text)
    ]


class Session:
    """One bash process reading the page's commands from its stdin, so variables (RUN), the
    working folder and exported settings carry from block to block as in a terminal."""

    def __init__(self, cwd: Path, env: dict[str, str]) -> None:
        self.process = subprocess.Popen(
            ["bash", "--noprofile", "--norc"], cwd=cwd, env=env, stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        )  # fmt: skip
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.background: list[int] = []
        self.run("set -e -m")  # a failing command ends the session; jobs get their own group

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def run(self, script: str, timeout_s: float = BLOCK_TIMEOUT_S) -> tuple[str, str]:
        """Run the script; what it printed, and the value of RUN afterwards."""
        marker = f"__done_{uuid.uuid4().hex}__"
        assert self.process.stdin is not None
        self.process.stdin.write(f'{script}\necho "{marker}${{RUN:-}}"\n')
        self.process.stdin.flush()
        out: list[str] = []
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                said = "".join(out)
                raise AssertionError(f"no end after {timeout_s} s of:\n{script}\n{said}") from None
            if line is None:
                raise AssertionError(f"the shell exited in:\n{script}\n{''.join(out)}")
            if line.startswith(marker):
                return "".join(out), line[len(marker) :].strip()
            out.append(line)

    def start(self, script: str, log: Path) -> None:
        """Run the script as a background job of the session (its own process group)."""
        self.run(f"( {script}\n) > {log} 2>&1 &\nBG_PID=$!")
        pid, _ = self.run('echo "$BG_PID"')
        self.background.append(int(pid))

    def close(self) -> None:
        """Stop the background jobs, the last started first (SIGTERM: the worker finishes its
        turns, the store keeps its data), then the shell."""
        for pid in reversed(self.background):
            _stop_group(pid)
        with suppress(OSError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(10)
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                with suppress(OSError):
                    stream.close()


def _stop_group(pid: int) -> None:
    try:
        family = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    with suppress(OSError):
        os.killpg(pid, signal.SIGTERM)
    _, alive = psutil.wait_procs(family, timeout=30)
    for process in alive:
        with suppress(psutil.NoSuchProcess):
            process.kill()
    psutil.wait_procs(alive, timeout=10)


def _expected(block: Block, port: int) -> str:
    return block.text.replace(":6379", f":{port}").rstrip("\n")


def _matches(expected: str, said: str) -> bool:
    pattern = ".*?".join(re.escape(part) for part in expected.split("..."))
    return re.fullmatch(pattern, said) is not None


@contextmanager
def session(env: dict[str, str]) -> Iterator[Session]:
    """A bash session in the checkout, its background jobs stopped at the end."""
    shell = Session(ROOT, env)
    try:
        yield shell
    finally:
        shell.close()


def _adapt(script: str, port: int) -> str:
    """The page's commands with the test's port; the checkout's environment where it is."""
    script = script.replace(":6379", f":{port}")
    script = script.replace("turnstile dev-server", f"turnstile dev-server --port {port}")
    if not (ROOT / ".venv" / "bin" / "activate").exists():  # a venv kept elsewhere (UV_*)
        script = script.replace(".venv/bin/activate", f"{Path(sys.prefix)}/bin/activate")
    return script


@pytest.mark.slow  # over 14 s on 2 cores: CI runs it in the slow part
def test_the_first_job_walkthrough_runs_as_written(tmp_path: Path) -> None:
    """Every command of docs/first-job.md runs as written against a fresh development store:
    the job loads; the Python script's run is held, approved and completes, printing what the
    page says; the command line's run shows the page's events, is held for its refund, is
    approved by the digest the page gives, is held again out of steps and extended, and ends
    completed with the failed stock check in its trace; the real-model run reaches the
    provider."""
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TURNSTILE_", "OPENAI_"))}
    agent = {"agent": {"off_plan": ["check_stock"]}}  # the stock check fails, off any plan
    with (
        wire_server("openai", script=agent) as wire,
        session({**env, "HOME": str(home), **wire.env}) as shell,
    ):
        walk = Walk(shell, home, free_port())
        blocks = page_blocks(PAGE.read_text())
        for number, block in enumerate(blocks):
            walk.step(block, blocks[number - 1] if number else None)
        _check_outcomes(walk, wire.received())


@dataclass
class Walk:
    """The page walked so far: each block done, what it printed, and RUN after it."""

    shell: Session
    home: Path
    port: int
    done: list[tuple[Block, str, str]] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def run_id(self) -> str:
        return self.done[-1][2] if self.done else ""

    def step(self, block: Block, before: Block | None) -> None:
        """Run, save or check one block of the page."""
        said, run_id = "", self.run_id
        if block.marker.startswith("file: "):
            (self.home / "desk" / block.marker.removeprefix("file: ")).write_text(block.text)
        elif block.marker.startswith("output") and before is not None:
            self.check(block, self.said_by(before))
        elif block.lang == "sh":
            said, run_id = self.run(_adapt(block.text, self.port), block.line)
        self.done.append((block, said, run_id))

    def run(self, script: str, line: int) -> tuple[str, str]:
        started = [s for s in script.splitlines() if s.startswith(LONG_RUNNING)]
        if not started:
            if "watch" in script and "--timeout-s" in script and self.run_id:
                _wait_not_running(self.url, self.run_id)  # the page shows it until it waits
            return self.shell.run(script)
        log = self.home / f"background-{line}.log"
        log.touch()  # the job's redirection makes it in a process of its own, later
        self.shell.start(script, log)
        if started[0].startswith("turnstile dev-server"):
            ready, what = "export TURNSTILE_REDIS_URL=", "the store's export line"
        else:  # a newcomer starts submitting once the worker says it is ready
            ready, what = '"worker_ready"', "the worker to be ready"
        wait_until(lambda: ready in log.read_text(), timeout_s=READY_TIMEOUT_S,
                   what=lambda: f"{what}: {log.read_text()[-3000:]}")  # fmt: skip
        return str(log), self.run_id

    def said_by(self, block: Block) -> str:
        """What the block printed: a background block's log, or a foreground block's output."""
        for done, said, _ in reversed(self.done):
            if done is block:
                return Path(said).read_text() if said.startswith(str(self.home)) else said
        raise AssertionError(f"block at line {block.line} did not run")

    def check(self, block: Block, said: str) -> None:
        expected = _expected(block, self.port)
        got = said.rstrip("\n").splitlines()[-1] if block.marker.endswith("last line") else said
        assert _matches(expected, got.rstrip("\n")), (
            f"{PAGE.name}:{block.line}: the page says\n{expected}\nbut it printed\n{said}"
        )


def _wait_not_running(url: str, run_id: str) -> None:
    client = client_for(url)
    wait_until(lambda: client.state(run_id).status.value != "running",
               what=f"run {run_id} to stop or wait", timeout_s=READY_TIMEOUT_S)  # fmt: skip


def _check_outcomes(walk: Walk, received: list[dict[str, object]]) -> None:
    """The command line's run ended completed after an approval and an extension; the trace
    showed the failed stock check; the real-model run was answered by the provider."""
    url, ran = walk.url, walk.done
    client = client_for(url)
    runs = [r for _, _, r in ran if r]
    cli_run, real_run = runs[0], runs[-1]
    assert cli_run != real_run
    state = client.state(cli_run)
    assert state.outcome is not None and state.outcome.value == "completed", state.reason
    assert [d.kind for d in state.decisions] == ["approved", "extended"]
    assert (state.budget.max_steps, state.usage.steps, state.answer) == (
        5, 4, "Refunded 2500 cents."
    )  # fmt: skip
    traced = next(said for block, said, _ in ran if "turnstile trace" in block.text)
    assert "tool check_stock not_found (no stock record for the item of A-2)" in traced
    _wait_not_running(url, real_run)
    assert received, "the provider was asked"
    models = {e.data.get("model") for e in client.events(real_run, timeout_s=5)
              if e.type == "turn"}  # fmt: skip
    assert models == {"openai:gpt-4.1-mini"}, models
