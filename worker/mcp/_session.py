"""One connection to one MCP server (for one tenant, when the server is per tenant): its
session on the process's MCP loop, the tools it lists, and its calls.

The session is made by the first caller that needs it, within `connect_timeout_s`; a server
that cannot be reached (or never answers its handshake) is tried again no sooner than
`retry_s` later, and meanwhile its calls fail at once with the reason. The session lives in a
task of its own on the loop (the SDK's contexts are entered and left by one task); it ends
when the server's stdout ends, when a call finds the connection gone, or at `close`. Its tools
are listed when it starts and again whenever the server says its list changed
(`notifications/tools/list_changed`, or the `subscriptions/listen` event of a 2026 server).

The loop's thread never takes a caller's lock (on a green worker that lock is gevent's, and a
greenlet holding it may be waiting on the loop): it only sets fields of its own session.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import AsyncIterator, Mapping
from concurrent.futures import Future
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from typing import Any, cast

import anyio
import mcp_types
import structlog
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import RequestParamsMeta
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import ValidationError

from turnstile.errors import TurnstileError
from turnstile.jobs.mcp import McpServer
from turnstile.jobs.tools import ToolError, ToolOutput, one_line
from turnstile.worker.mcp import _stdio
from turnstile.worker.mcp._loop import Loop

log = structlog.get_logger("turnstile.mcp")

PAGE_CAP = 100  # tools/list pages followed: a server that pages for ever cannot hang a listing
CANCEL_GRACE_S = 1.0  # after a call's deadline, for its cancellation to reach the server
CLIENT = mcp_types.Implementation(name="turnstile", version="1")
_VERSIONS = itertools.count(1)  # listings, in the order they were made, across connections


class McpUnavailableError(TurnstileError):
    """The server could not be reached, or its connection ended: the call was not made, or
    (a read) its answer was lost. The model sees it as the call's failure."""


@dataclass(frozen=True)
class Listing:
    """What a connection knows of its server's tools: their definitions (JSON, as the protocol
    spells them; None: never listed in this process), a version that moves when they change,
    and why there is no live session (None: there is one)."""

    tools: list[dict[str, Any]] | None
    version: int
    error: str | None


@dataclass
class _Session:
    client: Client
    stop: asyncio.Event
    child: _stdio.Child | None
    ended: str | None = None  # set when the session is over, by whoever ends it
    tasks: set[asyncio.Task[None]] = field(default_factory=set)
    task: Future[None] | None = None  # the session's own task: done when it is over


def reason(exc: BaseException) -> str:
    """One line for a failure, from the first leaf of an exception group."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    if isinstance(exc, MCPError):
        return one_line(f"MCP error {exc.code}: {exc.message}")
    text = " ".join(str(exc).split())
    return one_line(f"{type(exc).__name__}: {text}" if text else type(exc).__name__)


def _lost(exc: BaseException) -> bool:
    """Whether a call's failure means the connection is gone (not a refusal by the server)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    if isinstance(exc, MCPError):
        return exc.code == mcp_types.CONNECTION_CLOSED
    gone = (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream)
    return isinstance(exc, gone) or type(exc).__module__.startswith("httpx")


async def _list(client: Client) -> list[dict[str, Any]]:
    tools: list[dict[str, Any]] = []
    cursor: str | None = None
    for _ in range(PAGE_CAP):
        page = await client.list_tools(cursor=cursor)
        tools += [t.model_dump(by_alias=True, mode="json", exclude_none=True) for t in page.tools]
        cursor = page.next_cursor
        if not cursor:
            break
    return tools


class Connection:
    """One server's session in this process, shared by every turn that needs it."""

    def __init__(
        self,
        server: McpServer,
        values: Mapping[str, str],
        loop: Loop,
        *,
        connect_timeout_s: float,
        retry_s: float,
        label: str,
        logger: Any = log,
    ) -> None:
        self.server, self.values, self.loop, self.label = server, dict(values), loop, label
        self.log = logger  # a command that shows what it finds itself passes a quiet one
        self.connect_timeout_s, self.retry_s = connect_timeout_s, retry_s
        self._lock = threading.Lock()
        self._session: _Session | None = None
        self._listed: tuple[list[dict[str, Any]] | None, int] = (None, 0)
        self._error: str | None = None
        self._retry_at = 0.0
        self._tried = False  # a session was asked for at least once in this process
        self._reconnecting = False

    # -- what a caller sees ------------------------------------------------------------------

    def listing(self, *, wait: bool = False) -> Listing:
        """The tools as known now. The first time (or with `wait`) a session is made first,
        within the connect timeout; after that, a server without a session is connected
        again in the background when it is time, and the caller does not wait for it."""
        if wait or not self._tried:
            with suppress(McpUnavailableError):
                self._ensure(self.connect_timeout_s)
        elif self._due():
            threading.Thread(target=self._reconnect, name="turnstile-mcp-connect",
                             daemon=True).start()  # fmt: skip
        tools, version = self._listed
        return Listing(tools, version, self._error)

    def _due(self) -> bool:
        """No live session, none being made, and the retry time has come (the caller starts
        one)."""
        with self._lock:
            session = self._session
            if (session is not None and session.ended is None) or self._reconnecting:
                return False
            if session is None and time.monotonic() < self._retry_at:
                return False
            self._reconnecting = True
            return True

    def _reconnect(self) -> None:
        try:
            with suppress(McpUnavailableError):
                self._ensure(self.connect_timeout_s)
        finally:
            self._reconnecting = False

    def call(
        self, name: str, args: Mapping[str, Any], meta: Mapping[str, Any], *, timeout_s: float,
        mutates: bool,
    ) -> Any:  # fmt: skip
        """The call's result (its JSON). Past `timeout_s` the request is cancelled (the server
        is sent MCP's cancellation) and the call is observed past its timeout; a lost connection is
        McpUnavailableError, or for a write a ToolOutput of `unknown` status (it may have been
        done); an error the server answers with is a ToolError the model sees."""
        deadline = time.monotonic() + timeout_s
        session = self._ensure(max(0.0, min(self.connect_timeout_s, timeout_s)))

        sent = cast(RequestParamsMeta, dict(meta))

        async def go() -> dict[str, Any]:
            with anyio.fail_after(max(0.0, deadline - time.monotonic())):
                result = await session.client.call_tool(name, dict(args), meta=sent)
            return result.model_dump(by_alias=True, mode="json", exclude_none=True)

        try:
            return self.loop.run(go(), max(0.0, deadline - time.monotonic()) + CANCEL_GRACE_S)
        except TimeoutError:
            # Past its timeout, as the kernel says of any call (a write's outcome unknown);
            # the request was cancelled, which the server was told.
            self.log.info("mcp_call_cancelled", server=self.label, tool=name, timeout_s=timeout_s)
            spent_s = timeout_s + max(0.001, time.monotonic() - deadline)
            return ToolOutput({"status": "error", "code": "timeout"}, latency_s=spent_s)
        except ValidationError as exc:
            raise McpUnavailableError(
                f"server {self.server.name!r} answered {name!r} with a result that is not "
                f"MCP: {reason(exc)}"[:300]
            ) from None
        except Exception as exc:
            return self._failed(session, name, exc, mutates=mutates)

    def _failed(self, session: _Session, name: str, exc: Exception, *, mutates: bool) -> Any:
        if not _lost(exc):
            raise ToolError("mcp_error", reason(exc)) from None
        why = (session.child.ended if session.child else None) or session.ended or reason(exc)
        self._end(session, why)
        if mutates:
            return ToolOutput({"status": "unknown", "code": "mcp_connection_lost",
                               "detail": f"server {self.server.name!r}: {why}"})  # fmt: skip
        raise McpUnavailableError(f"server {self.server.name!r}: {why}") from None

    def close(self) -> Future[None] | None:
        """End the session (a stdio server is stopped); the future is done when it is over."""
        with self._lock:
            session, self._session = self._session, None
        if session is None:
            return None
        self._end(session, "closed")
        return session.task

    # -- the session --------------------------------------------------------------------------

    def _end(self, session: _Session, why: str) -> None:
        if session.ended is None:
            session.ended = why
        self.loop.call_soon(session.stop.set)

    def _ensure(self, wait_s: float) -> _Session:
        with self._lock:
            self._tried = True
            session = self._session
            if session is not None and session.ended is None:
                return session
            if session is not None:  # it ended: the next caller connects again at once
                self._session, self._error, self._retry_at = None, session.ended, 0.0
            if time.monotonic() < self._retry_at:
                raise McpUnavailableError(f"server {self.server.name!r}: {self._error}")
            try:
                self._session = self._connect(wait_s)
            except McpUnavailableError as exc:
                self._error = str(exc).removeprefix(f"server {self.server.name!r}: ")
                self._retry_at = time.monotonic() + self.retry_s
                self.log.warning("mcp_server_unavailable", server=self.label, reason=self._error)
                raise
            self._error = None
            tools, _ = self._listed
            self.log.info("mcp_server_connected", server=self.label,
                          transport=self.server.transport, tools=len(tools or []))  # fmt: skip
            return self._session

    def _connect(self, wait_s: float) -> _Session:
        """Start the session's task and wait for its handshake and first listing (the caller
        holds the lock)."""
        server, child = self.server, None
        if server.command is not None:
            try:
                child = _stdio.spawn(server.command, server.args, {**server.env, **self.values},
                                     server.cwd)  # fmt: skip
            except _stdio.SpawnError as exc:
                raise McpUnavailableError(f"server {server.name!r}: {exc}") from None
        ready: Future[_Session] = Future()
        task = self.loop.submit(self._hold(child, ready))
        try:
            session = self.loop.wait(ready, wait_s)
        except TimeoutError:
            task.cancel()  # the session's task stops the child on its way out
            what = "its handshake (initialize)" if child else "its handshake"
            raise McpUnavailableError(
                f"server {server.name!r}: did not answer {what} within {wait_s:.1f} s"
            ) from None
        except Exception as exc:
            why = (child.ended if child else None) or reason(exc)
            raise McpUnavailableError(f"server {server.name!r}: {why}") from None
        session.task = task
        return session

    @asynccontextmanager
    async def _transport(self, child: _stdio.Child | None) -> AsyncIterator[Any]:
        if child is not None:
            async with _stdio.transport(child) as streams:
                yield streams
            return
        assert self.server.url is not None
        headers = {**self.server.headers, **self.values}
        async with (
            create_mcp_http_client(headers=headers) as http,
            streamable_http_client(self.server.url, http_client=http) as streams,
        ):
            yield streams

    async def _hold(self, child: _stdio.Child | None, ready: Future[_Session]) -> None:
        """The session's life: connect, list, then serve calls until it is ended."""
        holder: list[_Session] = []
        try:
            async with (
                self._transport(child) as streams,
                Client(_Given(streams), cache=None, client_info=CLIENT,
                       message_handler=self._on_message(holder)) as client,
            ):  # fmt: skip
                self._listed = (await _list(client), next(_VERSIONS))
                session = _Session(client, asyncio.Event(), child)
                holder.append(session)
                ready.set_result(session)
                await self._serve(session)
        except Exception as exc:
            if not ready.done():
                ready.set_exception(exc)
            elif holder and holder[0].ended is None:
                holder[0].ended = reason(exc)
        finally:
            if holder and holder[0].ended is None:
                holder[0].ended = (child.ended if child else None) or "the session ended"

    async def _serve(self, session: _Session) -> None:
        """Until the session is stopped, or its child's stdout ends: follow the server's
        changes of its tools."""
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(self._listen, session)
            if session.child is not None:
                tasks.start_soon(_set_when, session.child.done, session.stop)
            await session.stop.wait()
            tasks.cancel_scope.cancel()
        if session.child is not None and session.ended is None:
            session.ended = session.child.ended

    async def _listen(self, session: _Session) -> None:
        """A 2026 server's `subscriptions/listen` stream of list changes (an older server
        sends `notifications/tools/list_changed`, see `_on_message`)."""
        if session.client.protocol_version not in MODERN_PROTOCOL_VERSIONS:
            return
        try:
            async with session.client.listen(tools_list_changed=True) as events:
                async for _ in events:
                    await self._relist(session.client)
        except Exception as exc:  # a server that does not offer it, or a stream that ended
            self.log.debug("mcp_listen_ended", server=self.label, reason=reason(exc))

    def _on_message(self, holder: list[_Session]) -> Any:
        async def handle(message: Any) -> None:
            if isinstance(message, mcp_types.ToolListChangedNotification) and holder:
                task = asyncio.get_running_loop().create_task(self._relist(holder[0].client))
                holder[0].tasks.add(task)
                task.add_done_callback(holder[0].tasks.discard)

        return handle

    async def _relist(self, client: Client) -> None:
        try:
            tools = await _list(client)
        except Exception as exc:
            self.log.warning("mcp_relist_failed", server=self.label, reason=reason(exc))
            return
        self._listed = (tools, next(_VERSIONS))
        self.log.info("mcp_tools_changed", server=self.label, tools=[t.get("name") for t in tools])


class _Given:
    """Streams already open, as the Transport a `Client` enters (its context is ours)."""

    def __init__(self, streams: Any) -> None:
        self.streams = streams

    async def __aenter__(self) -> Any:
        return self.streams

    async def __aexit__(self, *exc: object) -> None:
        return None


async def _set_when(done: asyncio.Event, stop: asyncio.Event) -> None:
    await done.wait()
    stop.set()
