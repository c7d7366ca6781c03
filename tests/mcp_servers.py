"""Real MCP servers for the tests, made with the `mcp` package's MCPServer (FastMCP's successor),
over stdio or streamable HTTP, recording what they receive.

    python -m tests.mcp_servers RECORD.jsonl stdio [VARIANT]
    python -m tests.mcp_servers RECORD.jsonl http [VARIANT]    # prints its port first

Every call is appended to RECORD as a JSON line (`{"event": "call", "tool", "args", "meta",
"pid"}`), and so are a call's cancellation (`"cancelled"`), a write's effect (`"executed"`,
with its idempotency key) and each listing of the tools (`"listed"`): a write seen before
under the same key answers from the record and is not executed again, as a server honouring
idempotency keys does, across restarts.

VARIANT `good` (the default) lists the desk tools; `bad` adds, to a few of them, a tool whose
schema is not JSON Schema, one whose name a model cannot call and one named `echo` (a Python
tool of the job's); `silent` reads its stdin and never answers, not even `initialize`.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import ToolAnnotations

KEY = "turnstile/idempotency-key"
READ = ToolAnnotations(read_only_hint=True)
ADDITIVE = ToolAnnotations(read_only_hint=False, destructive_hint=False)


def recorder(path: Path) -> Any:
    def record(event: str, **fields: Any) -> None:
        line = json.dumps({"event": event, "pid": os.getpid(), "t": time.time(), **fields})
        with path.open("a") as out:
            out.write(line + "\n")

    return record


@contextmanager
def serving(record: Path, variant: str = "good") -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """The test server over streamable HTTP in a process of its own: its URL and process
    (killed on the way out; a test may kill it sooner)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.mcp_servers", str(record), "http", variant],
        cwd=Path(__file__).parents[1], stdout=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        port = int(process.stdout.readline())
        yield f"http://127.0.0.1:{port}/mcp", process
    finally:
        process.kill()  # uvicorn's graceful stop waits for the clients' open streams
        process.wait(10)
        if process.stdout is not None:
            process.stdout.close()


def records(path: Path) -> list[dict[str, Any]]:
    """What a server recorded, in order (the tests' reader)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _meta(ctx: Context) -> dict[str, Any]:
    meta = ctx.request_context.meta
    return {k: v for k, v in dict(meta or {}).items() if k.startswith("turnstile/")}


def build(path: Path, variant: str) -> MCPServer:  # noqa: C901 - one server, its tools listed
    """The test server, recording to `path`."""
    server = MCPServer("turnstile-test", log_level="WARNING")
    record = recorder(path)

    def called(ctx: Context, tool: str, args: dict[str, Any]) -> dict[str, Any]:
        meta = _meta(ctx)
        token = (ctx.headers or {}).get("x-tenant-token")
        record("call", tool=tool, args=args, meta=meta, token=token)
        return meta

    def executed_before(key: str) -> dict[str, Any] | None:
        return next((r for r in records(path) if r["event"] == "executed" and r["key"] == key),
                    None)  # fmt: skip

    @server.tool(annotations=READ)
    def lookup_order(order: str, ctx: Context) -> dict[str, Any]:
        """Look an order up: its state and its carrier."""
        called(ctx, "lookup_order", {"order": order})
        return {"order": order, "state": "shipped", "carrier": "DHL"}

    @server.tool(annotations=ADDITIVE)
    def add_note(order: str, note: str, ctx: Context) -> dict[str, Any]:
        """Add a note to an order (notes are only ever added)."""
        meta = called(ctx, "add_note", {"order": order, "note": note})
        record("executed", tool="add_note", key=meta.get(KEY))
        return {"order": order, "noted": True}

    @server.tool()
    def create_ticket(title: str, ctx: Context) -> dict[str, Any]:
        """Open a support ticket (it pages a person: it cannot be taken back)."""
        meta = called(ctx, "create_ticket", {"title": title})
        before = executed_before(meta.get(KEY, ""))
        if before is None:
            record("executed", tool="create_ticket", key=meta.get(KEY))
        return {"ticket": f"T-{meta.get(KEY, '')[-6:]}", "replayed": before is not None}

    @server.tool(annotations=ADDITIVE)
    async def slow_write(title: str, seconds: float, ctx: Context) -> dict[str, Any]:
        """Open a ticket, then take `seconds` to say so."""
        meta = called(ctx, "slow_write", {"title": title, "seconds": seconds})
        if executed_before(meta.get(KEY, "")) is not None:
            return {"title": title, "replayed": True}
        record("executed", tool="slow_write", key=meta.get(KEY))
        await anyio.sleep(seconds)
        return {"title": title, "replayed": False}

    @server.tool(annotations=READ)
    async def slow_read(seconds: float, ctx: Context) -> str:
        """Read something that takes `seconds`."""
        called(ctx, "slow_read", {"seconds": seconds})
        try:
            await anyio.sleep(seconds)
        except anyio.get_cancelled_exc_class():
            record("cancelled", tool="slow_read")
            raise
        return "done"

    @server.tool(annotations=READ)
    def refuse(order: str, ctx: Context) -> str:
        """Refuse to say anything about the order."""
        called(ctx, "refuse", {"order": order})
        raise ToolError(f"order {order} is locked")

    @server.tool(annotations=READ)
    def die(n: int, ctx: Context) -> str:
        """Exit the server's process in the middle of the call."""
        called(ctx, "die", {"n": n})
        os._exit(3)

    @server.tool(annotations=READ)
    def huge(size: int, ctx: Context) -> str:
        """Answer with `size` bytes of text."""
        called(ctx, "huge", {"size": size})
        return "x" * size

    @server.tool(annotations=READ)
    async def garbage(ctx: Context) -> str:
        """Write a line that is not JSON-RPC on stdout instead of answering."""
        called(ctx, "garbage", {})
        os.write(_wire(), b"this is not JSON-RPC\n")
        await anyio.sleep(60)  # the client gives up on the session, not on this answer
        return "unreachable"

    @server.tool(annotations=ADDITIVE)
    async def grow(ctx: Context) -> str:
        """Add the tool `fresh` to the server's list, and say that the list changed."""
        called(ctx, "grow", {})
        if "fresh" not in [t.name for t in await server.list_tools()]:
            server.add_tool(_fresh, name="fresh", description="A tool added at run time.",
                            annotations=READ)  # fmt: skip
        await ctx.notify_tools_changed()
        await ctx.session.send_tool_list_changed()
        return "grown"

    listed = server.list_tools

    async def list_tools() -> Any:
        record("listed")
        return await listed()

    server.list_tools = list_tools  # type: ignore[method-assign]
    if variant == "bad":
        _add_bad_tools(server)
    return server


def _wire() -> int:
    """The descriptor the SDK's stdio server writes its messages to (it moves them off fd 1,
    so that a print cannot reach the client; this server means to break that)."""
    from mcp.server import stdio  # noqa: PLC0415

    claim = stdio._claims.get(1)
    return claim.private_fd if claim is not None and claim.private_fd is not None else 1


def _fresh() -> str:
    return "fresh"


def _add_bad_tools(server: MCPServer) -> None:
    """Tools no model can be offered, each in one way, and one clashing with a Python tool."""

    def broken(x: str) -> str:
        return x

    server.add_tool(broken, name="broken_schema", description="Its schema is no schema.")
    server._tool_manager.get_tool("broken_schema").parameters = {  # type: ignore[union-attr]
        "type": "object", "properties": {"x": {"type": "strng"}},
    }  # fmt: skip
    server.add_tool(broken, name="has space", description="A name no model can call.")
    server.add_tool(broken, name="echo", description="The job's Python tool has this name.")


def _silent() -> None:
    """Read stdin for ever; answer nothing."""
    while sys.stdin.buffer.readline():
        pass


def main() -> None:
    path, transport = Path(sys.argv[1]), sys.argv[2]
    variant = sys.argv[3] if len(sys.argv) > 3 else "good"
    if variant == "silent":
        _silent()
        return
    server = build(path, variant)
    if transport == "stdio":
        server.run()
        return
    listening = socket.socket()
    listening.bind(("127.0.0.1", 0))
    print(listening.getsockname()[1], flush=True)
    app = server.streamable_http_app()
    uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[listening])


if __name__ == "__main__":
    main()
