"""A crash of the store's machine, simulated: the server keeps only what it fsynced.

A small library preloaded into the server (built here with the machine's C compiler) wraps
`fsync` and `fdatasync` and logs, after each call that succeeds, the file's path and the size
it had when the call began: all of that is on the disk. The crash is a SIGKILL, then each
append-only file cut back to the last size an fsync covered (a file never fsynced to nothing),
then a restart on what is left: what an OS crash or a power loss would leave. Submissions,
step commits (turns run by a real worker) and decisions are then looked for, as acknowledged.

For `replica` the crash is of the primary alone: it is killed and its replica promoted.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from tests.integration.workers import client_for, running_workers, wait_until
from turnstile.errors import RunNotFoundError
from turnstile.jobs.state import RunState
from turnstile.jobs.support.scenarios import BY_LETTER, GOAL, USER
from turnstile.worker.client._client import Client
from turnstile.worker.dev.embedded import EmbeddedServer

pytestmark = pytest.mark.integration

SHIM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

/* The size is taken before the call: what was written by then is on the disk once it
   returns (another thread may append meanwhile, and that is not covered). */
static void note(int fd, off_t size) {
    const char *log = getenv("TURNSTILE_FSYNC_LOG");
    char link[64], path[4096], line[4200];
    if (log == NULL || size < 0) return;
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, path, sizeof path - 1);
    if (n < 0) return;
    path[n] = 0;
    int len = snprintf(line, sizeof line, "%lld %s\n", (long long)size, path);
    int out = open(log, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
    if (out < 0) return;
    if (write(out, line, len) < 0) {}
    close(out);
}

static off_t size_of(int fd) {
    struct stat st;
    return fstat(fd, &st) == 0 && S_ISREG(st.st_mode) ? st.st_size : -1;
}

int fsync(int fd) {
    static int (*real)(int);
    if (real == NULL) real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    off_t size = size_of(fd);
    int rc = real(fd);
    if (rc == 0) note(fd, size);
    return rc;
}

int fdatasync(int fd) {
    static int (*real)(int);
    if (real == NULL) real = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    off_t size = size_of(fd);
    int rc = real(fd);
    if (rc == 0) note(fd, size);
    return rc;
}
"""


@pytest.fixture(scope="module")
def shim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    compiler = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if compiler is None:
        pytest.skip("no C compiler (cc, gcc, clang) to build the fsync-logging library")
    where = tmp_path_factory.mktemp("fsync-shim")
    (where / "shim.c").write_text(SHIM)
    built = subprocess.run(
        [compiler, "-shared", "-fPIC", "-O2", "-o", str(where / "shim.so"),
         str(where / "shim.c"), "-ldl"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    return where / "shim.so"


class CrashableServer(EmbeddedServer):
    """A durable embedded server whose fsyncs are logged, so `crash` can keep only them."""

    def __init__(self, shim: Path, appendfsync: str) -> None:
        self.fsync_log = Path(shim).parent / f"fsyncs-{id(self)}.log"
        env = {"LD_PRELOAD": str(shim), "TURNSTILE_FSYNC_LOG": str(self.fsync_log)}
        self.bytes_cut = 0
        super().__init__(appendonly=True, appendfsync=appendfsync, env=env)

    def fsynced(self) -> dict[Path, int]:
        """The largest size each file had when an fsync of it began (the sizes only grow)."""
        sizes: dict[Path, int] = {}
        lines = self.fsync_log.read_text().splitlines() if self.fsync_log.exists() else []
        for line in lines:
            size, path = line.split(" ", 1)
            sizes[Path(path)] = max(sizes.get(Path(path), 0), int(size))
        return sizes

    def crash(self) -> str:
        """SIGKILL, then what an OS crash leaves: each incremental AOF cut to its last fsynced
        size (the base and the manifest are fsynced before they are renamed into place), then
        a restart. Returns the server's URL; `bytes_cut` says how much the cut took."""
        self.kill()
        fsynced = self.fsynced()
        for incr in (self.data_dir / "appendonlydir").glob("*.incr.aof"):
            keep = fsynced.get(incr.resolve(), 0)
            self.bytes_cut += max(0, incr.stat().st_size - keep)
            with incr.open("r+b") as file:
                file.truncate(keep)
        self.start()
        return self.url


@dataclass
class Losses:
    """Acknowledged writes missing after the crash, by kind."""

    submissions: list[str]
    commits: list[str]
    decisions: list[str]
    acknowledged: int  # writes of all three kinds acknowledged before the crash

    @property
    def total(self) -> int:
        return len(self.submissions) + len(self.commits) + len(self.decisions)


def _stored(client: Client, tenant: str, run_id: str) -> dict[str, str] | None:
    try:
        return client.run_hash(run_id, tenant)[1]
    except RunNotFoundError:
        return None


def _status(client: Client, tenant: str, run_id: str) -> tuple[str, str]:
    stored = _stored(client, tenant, run_id)
    return (stored["status"], stored.get("outcome", "")) if stored else ("missing", "")


def _approved(client: Client, tenant: str, run_id: str) -> bool:
    stored = _stored(client, tenant, run_id)
    decisions = RunState.from_json(stored["state"]).decisions if stored else []
    return [(d.kind, d.by) for d in decisions] == [("approved", "ann")]


def acknowledge_then_crash(
    url: str, broker_url: str, durability: str, unique: str, crash: Callable[[], str]
) -> Losses:
    """Acknowledged commits (runs a worker completed, as an observer saw them), decisions
    (approvals of suspended runs) and submissions, then `crash()`, which returns the URL of
    the server that is left; what it lacks of them."""
    queue, idle, tenant = f"crash-{unique}", f"idle-{unique}", f"t-{unique}"
    client = client_for(url, broker_url, durability=durability)
    env = {"TURNSTILE_DURABILITY": durability}
    with running_workers(url, [queue], 1, env=env, broker_url=broker_url, concurrency=2):
        g = BY_LETTER["G"].params  # suspends for an approval
        held = [client.submit(tenant, USER, "support", GOAL, g, queue=queue) for _ in range(3)]
        plain = [client.submit(tenant, USER, "support", GOAL, {}, queue=queue) for _ in range(4)]
        wait_until(
            lambda: (
                all(_status(client, tenant, r)[0] == "suspended" for r in held)
                and all(_status(client, tenant, r)[0] == "stopped" for r in plain)
            ),
            what="runs to suspend or end",
        )
        seen = {r: _status(client, tenant, r) for r in plain}
        client.store.fence("the runs read are")  # shown only once durable, as `status` does
    for run_id in held:  # the worker is gone: nothing writes after the last acknowledgement
        client.approve(run_id, by="ann")
    late = [client.submit(tenant, USER, "support", GOAL, {}, queue=idle) for _ in range(5)]
    after = client_for(crash())
    return Losses(
        submissions=[r for r in held + plain + late if _status(after, tenant, r)[0] == "missing"],
        commits=[r for r in plain if _status(after, tenant, r) != seen[r]],
        decisions=[r for r in held if not _approved(after, tenant, r)],
        acknowledged=len(held) * 2 + len(plain) * 2 + len(late),
    )


@contextmanager
def broker() -> Iterator[EmbeddedServer]:
    """Celery's broker on a server of its own: only the store crashes."""
    with EmbeddedServer() as server:
        yield server


def test_none_loses_acknowledged_writes_in_a_crash(shim: Path, unique: str) -> None:
    """With durability `none` on a server that leaves fsync to the OS (appendfsync no),
    acknowledged submissions, commits and decisions are lost in the crash: the proof that this
    test sees a loss when there is one."""
    with broker() as b, CrashableServer(shim, "no") as store:
        losses = acknowledge_then_crash(store.url, b.url, "none", unique, store.crash)
        assert store.bytes_cut > 0
        assert losses.submissions and losses.commits and losses.decisions, losses


def test_aof_loses_nothing_acknowledged_in_a_crash(shim: Path, unique: str) -> None:
    """With durability `aof` on the durable server (appendfsync always), every acknowledged
    submission, commit and decision survives a crash that keeps only what was fsynced."""
    with broker() as b, CrashableServer(shim, "always") as store:
        losses = acknowledge_then_crash(store.url, b.url, "aof", unique, store.crash)
        incr = [p for p in store.fsynced() if p.name.endswith(".incr.aof")]
        assert incr, "the server's fsyncs of its AOF were not seen"
        assert losses.total == 0, losses


@pytest.mark.slow  # over 10 s on 2 cores: CI runs it in the slow part
def test_replica_loses_nothing_acknowledged_when_the_primary_crashes(unique: str) -> None:
    """With durability `replica`, the primary (no AOF at all) is killed and its replica
    promoted: every acknowledged submission, commit and decision is on the replica."""
    with broker() as b, EmbeddedServer() as primary, EmbeddedServer() as replica:
        follower = redis.Redis.from_url(replica.url)
        follower.replicaof("127.0.0.1", primary.port)
        leader = redis.Redis.from_url(primary.url)

        def synced() -> bool:
            # Both ends: the replica's link is up, and the primary counts it online (the
            # client's durability check reads the primary's count, which lags a moment).
            followed = leader.info("replication").get("slave0")
            online = isinstance(followed, dict) and followed.get("state") == "online"
            return online and follower.info("replication").get("master_link_status") == "up"

        wait_until(synced, what="the replica to sync")
        leader.close()

        def crash() -> str:
            primary.kill()
            follower.replicaof("NO", "ONE")
            return replica.url

        losses = acknowledge_then_crash(primary.url, b.url, "replica", unique, crash)
        follower.close()
        assert losses.acknowledged > 0 and losses.total == 0, losses
