"""One asyncio event loop per worker process, on an OS thread of its own, that every MCP
session of the process lives on; tool calls, which run on the kernel's tool threads (or
greenlets), hand it coroutines and wait for their results.

The `mcp` client is asyncio (anyio); a worker's turns are not. So the loop is made on first
use, in the process that uses it (after a prefork pool's fork: nothing of it is inherited),
and a caller blocks only its own thread while it waits:

- on prefork, on a `concurrent.futures.Future` with a timeout;
- on a green worker, on a gevent `async_` watcher that the loop's thread fires when the result
  is in: the waiting greenlet yields to the hub, so the other turns go on. The loop's thread
  is a real OS thread (gevent's own `start_new_thread`), with its own hub under asyncio's
  selector, so it never blocks the worker's hub.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import Coroutine
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")
START_TIMEOUT_S = 10.0  # the loop's thread has started well before this on any machine


def green() -> bool:
    """Whether this process runs on gevent's monkeypatched standard library (a green worker)."""
    if "gevent.monkey" not in sys.modules:
        return False
    from gevent import monkey  # noqa: PLC0415 - only a green worker loads gevent

    return bool(monkey.is_module_patched("threading"))


def _start_thread(target: Any) -> None:
    if green():
        from gevent import monkey  # noqa: PLC0415 - only a green worker loads gevent

        monkey.get_original("_thread", "start_new_thread")(target, ())
        return
    threading.Thread(target=target, name="turnstile-mcp", daemon=True).start()


class Loop:
    """The process's MCP event loop, started on first use."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()

    def _running(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                started: Future[asyncio.AbstractEventLoop] = Future()

                def run() -> None:
                    loop = asyncio.new_event_loop()
                    loop.call_soon(started.set_result, loop)
                    loop.run_forever()

                _start_thread(run)
                try:
                    self._loop = self.wait(started, START_TIMEOUT_S)
                except TimeoutError:
                    raise RuntimeError("the MCP event loop's thread did not start") from None
            return self._loop

    def submit(self, coro: Coroutine[Any, Any, T]) -> Future[T]:
        """Run `coro` on the loop; its result, or exception, in the future returned."""
        return asyncio.run_coroutine_threadsafe(coro, self._running())

    def call_soon(self, fn: Any, *args: Any) -> None:
        """`fn(*args)` on the loop's thread."""
        self._running().call_soon_threadsafe(fn, *args)

    def wait(self, future: Future[T], timeout_s: float) -> T:
        """The future's result within `timeout_s` (else TimeoutError; the future is left to
        finish on its own), blocking only the calling thread or greenlet."""
        if not future.done() and green():
            _wait_green(future, timeout_s)
        elif not future.done():
            future.result(max(0.0, timeout_s))  # raises TimeoutError past the wait
        if not future.done():
            raise TimeoutError(f"no answer within {timeout_s:.1f} s")
        return future.result(0)

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float) -> T:
        """`coro` on the loop, waited for at most `timeout_s`; cancelled past that."""
        future = self.submit(coro)
        try:
            return self.wait(future, timeout_s)
        except TimeoutError:
            future.cancel()
            raise


def _wait_green(future: Future[Any], timeout_s: float) -> None:
    """Yield to gevent's hub until the loop's thread finishes `future` or `timeout_s` passes."""
    import gevent  # noqa: PLC0415 - only a green worker loads gevent

    hub = gevent.get_hub()
    watcher = hub.loop.async_()
    future.add_done_callback(lambda _: watcher.send())  # thread-safe: wakes this hub
    try:
        with gevent.Timeout(max(0.0, timeout_s), False):
            while not future.done():
                hub.wait(watcher)
    finally:
        watcher.close()
