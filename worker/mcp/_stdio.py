"""An MCP server started as a child of the worker process, spoken to over its stdin and stdout:
one JSON-RPC message a line, as the protocol's stdio transport says.

The child is started by the caller's thread with the standard library's `subprocess` (gevent's,
on a green worker, which reaps it from the worker's hub), and its pipes are handed to the MCP
event loop. A line that is not a JSON-RPC message, or one longer than MAX_LINE_BYTES, ends
the session with a line saying so: a server that writes anything else on its stdout breaks
the protocol, and every call waiting on it fails at once rather than at its deadline.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field

import anyio
import mcp_types
from mcp.client.stdio import get_default_environment
from mcp.shared.message import SessionMessage

from turnstile.errors import TurnstileError
from turnstile.jobs.tools import one_line
from turnstile.worker.mcp._loop import green

MAX_LINE_BYTES = 16 * 1024 * 1024  # far above a result the kernel keeps (jobs/tools.py)
STOP_GRACE_S = 2.0  # from SIGTERM to SIGKILL for a server that does not stop


class SpawnError(TurnstileError):
    """The server's command could not be started."""


@dataclass
class Child:
    """A started server: its process and the ends of its pipes the loop reads and writes."""

    process: subprocess.Popen[bytes]
    read_fd: int
    write_fd: int
    ended: str | None = None  # why its session ended, one line
    done: asyncio.Event = field(default_factory=asyncio.Event)  # set when its stdout ends

    def alive(self) -> bool:
        # On a green worker gevent's child watcher sets the return code from the worker's hub;
        # `poll` would enter a hub from the loop's thread.
        return self.process.returncode is None if green() else self.process.poll() is None


def spawn(command: str, args: tuple[str, ...], env: Mapping[str, str], cwd: str | None) -> Child:
    """Start the server (in the calling thread), its stdout and stdin as plain descriptors."""
    try:
        process = subprocess.Popen(  # noqa: S603 - the job's own declared command
            [command, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env={**get_default_environment(), **env},
            cwd=cwd,
        )
    except (OSError, ValueError) as exc:
        raise SpawnError(one_line(f"cannot start {command!r}: {exc}")) from None
    assert process.stdout is not None and process.stdin is not None
    read_fd, write_fd = os.dup(process.stdout.fileno()), os.dup(process.stdin.fileno())
    process.stdout.close()
    process.stdin.close()
    return Child(process, read_fd, write_fd)


async def _stop(child: Child) -> None:
    """SIGTERM, then SIGKILL past the grace; waits (on prefork) until the child is reaped."""
    with suppress(ProcessLookupError):
        if child.alive():
            child.process.terminate()
    with anyio.move_on_after(STOP_GRACE_S):
        while child.alive():
            await anyio.sleep(0.02)
    with suppress(ProcessLookupError):
        if child.alive():
            child.process.kill()
            if not green():
                await anyio.to_thread.run_sync(child.process.wait)


def _message(line: bytes) -> SessionMessage | str:
    """The line as a message, or why it is not one."""
    try:
        return SessionMessage(mcp_types.jsonrpc_message_adapter.validate_json(line, by_name=False))
    except ValueError:
        shown = one_line(line.decode(errors="replace"), 80)
        return f"wrote a line on its stdout that is not a JSON-RPC message: {shown!r}"


@asynccontextmanager
async def transport(child: Child) -> AsyncIterator[tuple[object, object]]:
    """The child's pipes as the read and write streams an MCP session takes; on the way out
    the child is stopped."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=MAX_LINE_BYTES, loop=loop)
    rpipe = os.fdopen(child.read_fd, "rb", buffering=0)
    wpipe = os.fdopen(child.write_fd, "wb", buffering=0)
    read_transport, _ = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader, loop=loop), rpipe
    )
    write_transport, protocol = await loop.connect_write_pipe(
        lambda: asyncio.streams.FlowControlMixin(loop=loop), wpipe
    )
    writer = asyncio.StreamWriter(write_transport, protocol, None, loop)
    inbound, to_session = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    from_session, outbound = anyio.create_memory_object_stream[SessionMessage](0)

    async def read() -> None:
        async with inbound:
            while True:
                try:
                    line = await reader.readline()
                except ValueError:  # asyncio's word for a line over the limit
                    child.ended = f"wrote a message over {MAX_LINE_BYTES} bytes"
                    break
                if not line:
                    child.ended = child.ended or "closed its stdout (it exited)"
                    break
                if not line.strip():
                    continue
                message = _message(line)
                if isinstance(message, str):
                    child.ended = message
                    break
                await inbound.send(message)
        child.done.set()

    async def write() -> None:
        async with outbound:
            async for sent in outbound:
                data = sent.message.model_dump_json(by_alias=True, exclude_unset=True)
                try:
                    writer.write(data.encode() + b"\n")
                    await writer.drain()
                except (OSError, RuntimeError):  # the child is gone: its stdout ends too
                    child.ended = child.ended or "closed its stdin (it exited)"
                    return

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(read)
        tasks.start_soon(write)
        try:
            yield to_session, from_session
        finally:
            tasks.cancel_scope.cancel()
            with anyio.CancelScope(shield=True):
                writer.close()
                read_transport.close()
                await _stop(child)
