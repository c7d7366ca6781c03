"""The worker's pool choice, read before anything is imported, and its checks."""

from __future__ import annotations

import subprocess
import sys

import pytest

from turnstile.worker.broker.app import KOMBU_CHANNEL_CONNECTIONS
from turnstile.worker.runtime.app import make_app
from turnstile.worker.runtime.pools import SPARE_CONNECTIONS, check, pool_in_argv
from turnstile.worker.settings import Settings


@pytest.mark.parametrize(
    ("argv", "env", "pool"),
    [
        (["worker", "--pool", "gevent"], {}, "gevent"),
        (["worker", "-P", "gevent"], {}, "gevent"),
        (["worker", "--pool=gevent"], {}, "gevent"),
        (["worker"], {"TURNSTILE_POOL": "gevent"}, "gevent"),
        (["worker", "--pool", "prefork"], {"TURNSTILE_POOL": "gevent"}, "prefork"),
        (["worker"], {}, "prefork"),
        (["submit", "--pool", "gevent"], {}, "prefork"),
    ],
)
def test_the_pool_is_read_from_the_command_line_first(
    argv: list[str], env: dict[str, str], pool: str
) -> None:
    """`turnstile worker` finds its pool (option over environment) before importing anything,
    and only the worker command ever patches."""
    assert pool_in_argv(argv, env) == pool


def test_only_pools_that_stop_a_hung_call_are_accepted() -> None:
    """A pool that cannot enforce hard limits, an unknown pool and a concurrency outside the
    pool's range are refused; prefork and gevent at their ranges are not."""
    assert check("gevent", 500, lambda: ["support"]) is None
    assert check("prefork", 2, lambda: ["support"]) is None
    assert "cannot stop a call" in (check("threads", 10, lambda: ["support"]) or "")
    assert "support" in (check("threads", 10, lambda: ["support"]) or "")
    assert (check("fork", 2, lambda: []) or "").startswith("bad --pool 'fork'")
    assert (check("gevent", 0, lambda: []) or "").startswith("bad --concurrency 0")
    assert (check("prefork", 2000, lambda: []) or "").startswith("bad --concurrency 2000")


def test_a_green_workers_broker_channels_hold_a_connection_per_turn() -> None:
    """Every turn of a green worker may ack or publish at once: each Redis channel's own client
    pool is bounded by the turns and the spare connections, not kombu's 10, which failed the
    eleventh ack at once ("Too many connections") and restarted the consumer."""
    url = "redis://127.0.0.1:1/0"
    green = make_app(Settings(redis_url=url, pool="gevent", concurrency=1000), main=False)
    options = green.conf.broker_transport_options
    assert options["max_connections"] == 1000 + SPARE_CONNECTIONS
    assert (
        make_app(Settings(redis_url=url), main=False).conf.broker_transport_options[
            "max_connections"
        ]
        == KOMBU_CHANNEL_CONNECTIONS
    )  # a prefork worker's, as kombu's default


GREEN_POLL = """
import select, socket, time
from turnstile.worker.runtime.pools import patch_if_green
assert patch_if_green(["worker", "--pool", "gevent"], {})
import gevent
a, b = socket.socketpair()
poller = select.poll()
poller.register(a, select.POLLIN)
assert poller.poll(0) == []
b.send(b"x")
assert poller.poll(0) == [(a.fileno(), select.POLLIN)]
poller.unregister(a)
assert poller.poll(0) == []
c, d = socket.socketpair()
waiting = select.poll()
waiting.register(c, select.POLLIN)
gevent.spawn_later(0.05, d.send, b"y")  # runs only if the wait below yields to the hub
started = time.monotonic()
assert waiting.poll(2000) == [(c.fileno(), select.POLLIN)]
assert time.monotonic() - started < 1.5
print("ok")
"""


def test_a_green_workers_zero_timeout_poll_asks_the_kernel_and_a_wait_still_yields() -> None:
    """On a green worker, `select.poll().poll(0)` (redis-py's and httpcore's check of a pooled
    connection) answers the sockets' state at once without a trip through gevent's hub, and a
    poll with a timeout still waits in the hub, letting other greenlets run."""
    done = subprocess.run(
        [sys.executable, "-c", GREEN_POLL], capture_output=True, text=True, timeout=60,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
