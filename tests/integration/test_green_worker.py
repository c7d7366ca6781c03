"""The gevent pool (issue 12): hundreds of turns in flight in one worker process, each renewing
its own lease, a hub that blocks killed from outside, and a SIGKILL mid-wave that loses
nothing and doubles nothing."""

from __future__ import annotations

import resource
import subprocess
import sys
import time

import pytest

from tests.integration.test_chaos import _ledger_problems, _run_problems
from tests.integration.workers import (
    WorkerProcess,
    client_for,
    expected_rows,
    running_workers,
    wait_until,
)
from turnstile.jobs.support.scenarios import BY_LETTER, GOAL, USER
from turnstile.worker.client._client import Client
from turnstile.worker.dev.embedded import EmbeddedServer
from turnstile.worker.store import keys

pytestmark = pytest.mark.integration

WAVE = 200
LETTERS = "ABCFA"  # end on their own; A and F refund, so a refund replayed would show
IN_FLIGHT_AT_KILL = 120  # turns in flight in the one process when it is killed
WAVE_SLOW = {"sleep_s": {"get_order": 2.0, "issue_refund": 2.0, "send_status_email": 2.0}}


def test_a_green_worker_renews_the_lease_of_every_turn_in_flight(
    redis_url: str, unique: str
) -> None:
    """Twenty turns wait at once in one green process for longer than their lease: each turn's
    lease is renewed, so the sweeper re-sends none of them and every run completes."""
    queue, tenant = f"beat-{unique}", f"t-{unique}"
    env = {"TURNSTILE_INFLIGHT_LEASE_S": "1.5"}
    with running_workers(redis_url, [queue], 1, env=env, pool="gevent") as (worker,):
        client = client_for(redis_url)
        runs = [
            client.submit(
                tenant, USER, "support", GOAL, {"sleep_s": {"get_order": 4.0}}, queue=queue
            )
            for _ in range(20)
        ]
        wait_until(
            lambda: client.client.hlen(keys.inflight(tenant)) == 20, what="all twenty in turn"
        )
        wait_until(
            lambda: all(client.run_hash(r)[1]["status"] == "stopped" for r in runs),
            timeout_s=60,
            what="every run ends",
        )
        # This test's own runs: the sweeper also serves the runs other tests left on the
        # session's server, whose leases lapse when their workers stop.
        assert [e for e in worker.events("step_resent") if e.get("tenant") == tenant] == []
        assert {client.state(r).outcome for r in runs} == {"completed"}


def test_a_blocked_hub_kills_its_process() -> None:
    """A green process whose hub is held by a call that never yields is killed by the
    watchdog's OS thread within its limit, with one line saying why."""
    code = (
        "from gevent import monkey; monkey.patch_all()\n"
        "import sys\n"
        "from turnstile.worker.runtime.pools import Watchdog\n"
        "Watchdog(0.5, on_kill=lambda s: print('hub_blocked', flush=True)).start()\n"
        "import gevent; gevent.sleep(0.2)\n"
        "monkey.get_original('time', 'sleep')(30)\n"
        "print('survived', flush=True)\n"
    )
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, timeout=20, check=False
    )
    assert done.returncode == -9, done
    assert done.stdout.decode().split() == ["hub_blocked"]
    assert time.monotonic() - started < 10


def _submit_wave(client: Client, queue: str, tenant: str) -> list[str]:
    runs = []
    for i in range(WAVE):
        scenario = BY_LETTER[LETTERS[i % len(LETTERS)]]
        params = {**scenario.params, **WAVE_SLOW}
        runs.append(
            client.submit(
                tenant, USER, "support", GOAL, params, budget=scenario.budget, queue=queue
            )
        )
    return runs


@pytest.mark.slow  # 200 runs sleeping 2 s a tool, a kill and a restart: 25-70 s
def test_a_green_worker_killed_mid_wave_loses_and_doubles_nothing(
    own_server: EmbeddedServer, unique: str
) -> None:
    """200 runs in flight in one green worker process; it is SIGKILLed mid-wave and started
    again: every run ends exactly once with one outcome, no order is refunded twice, and the
    tenant's committed ledger equals the runs' recorded usage."""
    url = own_server.url
    queue, tenant = f"wave-{unique}", f"t-{unique}"
    client = client_for(url)

    def worker(name: str) -> WorkerProcess:
        return WorkerProcess(url, [queue], name=f"{name}-{unique}", concurrency=5,
                             pool="gevent").start()  # fmt: skip

    first = worker("wave0")
    try:
        first.wait_ready()
        runs = _submit_wave(client, queue, tenant)
        wait_until(
            lambda: client.client.hlen(keys.inflight(tenant)) >= IN_FLIGHT_AT_KILL,
            timeout_s=60,
            every_s=0.01,
            what="most of the wave in flight at once",
        )
    finally:
        first.kill()
    second = worker("wave1")
    try:
        second.wait_ready()
        wait_until(
            lambda: all(client.run_hash(r)[1]["status"] == "stopped" for r in runs),
            timeout_s=90,
            what="every run ends after the restart",
        )
    finally:
        second.stop()
    problems = []
    for run_id in runs:
        problems += _run_problems(client, tenant, run_id)
    problems += _ledger_problems(client, tenant, runs)
    assert problems == [], "\n".join(problems)
    expected = expected_rows()
    for i, run_id in enumerate(runs):  # each ends as its scenario does in process
        assert client.state(run_id).outcome == expected[LETTERS[i % len(LETTERS)]]["outcome"]


# Run in front of a worker: takes every free descriptor up to 1,100 and keeps them open across
# its exec, so that each one the worker opens is numbered past them.
HOLD_LOW_FDS = (
    "import os, resource, sys\n"
    "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
    "resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 8192)), hard))\n"
    "fd = os.open(os.devnull, os.O_RDONLY)\n"
    "while fd < 1100:\n"
    "    os.set_inheritable(fd, True)\n"
    "    fd = os.dup(fd)\n"
    "os.execv(sys.argv[1], sys.argv[1:])\n"
)


def test_a_green_worker_whose_descriptors_are_past_select_s_limit_runs_on(
    redis_url: str, unique: str
) -> None:
    """select(2) takes no descriptor numbered 1,024 or more, and kombu polls with it under a
    green pool: a worker with hundreds of turns in flight holds that many sockets, and its
    broker connection made anew, or its wake pipe, stopped it ("Unrecoverable error"). Here
    every descriptor the worker opens is numbered past 1,100, and its runs, more of them than
    its slots (so its consumer also waits for a slot to free), all complete."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < 2048:
        pytest.skip(f"the descriptor limit ({hard}) leaves no room past 1,100")
    queue, tenant = f"fds-{unique}", f"t-{unique}"
    worker = WorkerProcess(redis_url, [queue], name=f"fds-{unique}", pool="gevent")
    supervisor, command = worker.args[:3], worker.args[3:]
    assert supervisor[-1] == "tests.integration.supervise"
    worker.args = [*supervisor, sys.executable, "-c", HOLD_LOW_FDS, *command]
    worker.start()
    try:
        worker.wait_ready()
        client = client_for(redis_url)
        runs = [
            client.submit(
                tenant, USER, "support", GOAL, {"sleep_s": {"get_order": 0.3}}, queue=queue
            )
            for _ in range(60)  # the worker has 50 slots
        ]

        def ended() -> bool:
            assert worker.process is not None and worker.process.poll() is None, worker.log()[
                -3000:
            ]
            return all(client.run_hash(r)[1]["status"] == "stopped" for r in runs)

        wait_until(ended, timeout_s=90, what="every run ends")
        assert {client.state(r).outcome for r in runs} == {"completed"}
        assert "Unrecoverable error" not in worker.log()
    finally:
        worker.stop()
