"""`turnstile worker --reload`, for developing a job: the command supervises the worker as a
child process and starts a new one when a job's module changes, so the jobs are imported
afresh. Development only: a restart stops the turns in flight after a grace (they are
delivered again), and the files are looked at twice a second.

Which files: for each registration (the `turnstile.jobs` entry points and TURNSTILE_JOBS),
the file of the module it names; when that module belongs to a package (or is one), every
`.py` file of that package's folder and below it, symbolic links and hidden, cache and
virtual-environment folders left out.

Why a poll of modification times and not a file-system watcher (watchfiles, inotify): a
job is a handful of files, so a poll costs nothing worth saving; it sees edits made through
a container's bind mount or a network share, where change events often never arrive; and
it adds no dependency to what every production worker installs for a development aid.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import FrameType

from turnstile.worker.registry import candidates

POLL_S = 0.5
STOP_TIMEOUT_S = 10.0  # a warm shutdown's turns in flight get this long, then the worker dies
MAX_FILES = 5000  # a folder this big is not a job's package: watch no more of it
SKIP_DIRS = frozenset({"__pycache__", "node_modules", "site-packages", "dist-packages"})
PREFIX = "turnstile worker --reload"

Snapshot = dict[str, tuple[int, int, int]]  # path: (mtime ns, size, inode)


def say(text: str) -> None:
    """One line for the developer, on stderr beside the worker's own log."""
    sys.stderr.write(f"{PREFIX}: {text}\n")
    sys.stderr.flush()


def _module_of(source: str) -> str:
    """The module a registration names: `entry point n = m.sub:attr` or `TURNSTILE_JOBS m:attr`."""
    ref = source.split(" = ", 1)[1] if " = " in source else source.split(" ", 1)[-1]
    return ref.partition(":")[0].strip()


def _roots(module: str) -> list[Path]:
    """The module's file, or the folder of the package it is part of (searched below)."""
    try:
        spec = importlib.util.find_spec(module)
    except Exception as exc:  # a parent package that does not import: nothing to watch yet
        say(f"cannot watch {module}: {type(exc).__name__}: {exc}")
        return []
    if spec is None or not spec.origin or not spec.has_location:
        return []
    origin = Path(spec.origin)
    if spec.submodule_search_locations is not None or "." in module:
        return [origin.parent]  # a package, or a module inside one: its folder
    return [origin]


def watched_roots(spec: str) -> list[Path]:
    """Where the registered jobs' code lives (the entry points' and those `spec`, the value of
    TURNSTILE_JOBS, names), as files and folders to look at."""
    roots: list[Path] = []
    for plugin in candidates(spec):
        module = _module_of(plugin.source)
        for root in _roots(module) if module else []:
            if root not in roots:
                roots.append(root)
    return roots


def _files(roots: Iterable[Path]) -> Iterable[Path]:
    count = 0
    for root in roots:
        if root.is_file():
            yield root
            continue
        for folder, dirs, files in os.walk(root):  # os.walk does not follow links to folders
            dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.startswith("."))
            for name in sorted(files):
                if name.endswith(".py"):
                    count += 1
                    if count > MAX_FILES:
                        return
                    yield Path(folder) / name


def snapshot(roots: Iterable[Path]) -> Snapshot:
    """Each watched file's modification time, size and inode (an editor's save by rename
    changes the inode, even when the time and the size do not)."""
    out: Snapshot = {}
    for path in _files(roots):
        try:
            st = path.stat()
        except OSError:
            continue  # removed between the listing and the look
        out[str(path)] = (st.st_mtime_ns, st.st_size, st.st_ino)
    return out


def changed(before: Snapshot, after: Snapshot) -> str | None:
    """A file that was added, removed or modified, or None."""
    return next((p for p in sorted(before.keys() | after.keys()) if before.get(p) != after.get(p)),
                None)  # fmt: skip


class Supervisor:
    """Runs the worker command as a child and restarts it on a change of the job files."""

    def __init__(
        self,
        argv: list[str],
        env: Mapping[str, str],
        roots: list[Path],
        *,
        poll_s: float = POLL_S,
        stop_timeout_s: float = STOP_TIMEOUT_S,
    ) -> None:
        self.argv, self.env, self.roots = argv, dict(env), roots
        self.poll_s, self.stop_timeout_s = poll_s, stop_timeout_s
        self.child: subprocess.Popen[bytes] | None = None
        self.stopping = False

    def _start(self) -> None:
        # In the supervisor's process group, so whatever stops the group (a terminal's Ctrl-C
        # or hang-up, a harness's kill of the group) stops the worker too, never orphans it.
        self.child = subprocess.Popen(self.argv, env=self.env)  # noqa: S603 - our own argv

    def _stop(self) -> int:
        child = self.child
        if child is None:
            return 0
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)  # Celery's warm shutdown
            try:
                child.wait(self.stop_timeout_s)
            except subprocess.TimeoutExpired:
                say(f"the worker did not stop in {self.stop_timeout_s:g} s; killing it (its turns "
                    "are delivered again)")  # fmt: skip
                child.kill()  # its pool processes follow: billiard sets their parent-death signal
                child.wait()
        return child.returncode or 0

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.stopping = True

    def run(self) -> int:
        """Until SIGTERM, SIGINT or SIGHUP: then the worker is stopped warmly and its exit
        status is the command's."""
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, self._on_signal)
        files = snapshot(self.roots)
        shown = ", ".join(str(r) for r in self.roots) or "no files (no job module found)"
        say(f"watching {len(files)} files under {shown}")
        self._start()
        reported = False
        while not self.stopping:
            time.sleep(self.poll_s)
            now = snapshot(self.roots)
            path = changed(files, now)
            if path is not None:
                say(f"{path} changed; restarting the worker")
                self._stop()
                files, reported = now, False
                if not self.stopping:
                    self._start()
            elif self.child is not None and self.child.poll() is not None and not reported:
                say(f"the worker exited ({self.child.returncode}); it starts again when a job's "
                    "module changes")  # fmt: skip
                reported = True
        return self._stop()


def supervise(args: list[str], env: Mapping[str, str], jobs: str) -> int:
    """Run `turnstile <args>` (the worker command without --reload) in `env` under a
    Supervisor, watching the modules of the entry points and of `jobs` (TURNSTILE_JOBS)."""
    child_env = {**env, "TURNSTILE_WORKER_RELOAD": "0"}
    argv = [sys.executable, "-m", "turnstile", *args]
    return Supervisor(argv, child_env, watched_roots(jobs)).run()
