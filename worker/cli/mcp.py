"""`turnstile mcp`: Turnstile's runs as the tools of an MCP server (worker/mcp/server.py)."""

from __future__ import annotations

from typing import Annotated

import typer

from turnstile.worker.cli.common import BrokerUrl, RedisUrl, client, fail


def mcp(
    tenant: Annotated[
        str | None,
        typer.Option("--tenant", envvar="TURNSTILE_MCP_TENANT", show_default=False,
                     help="Over stdio: the tenant every call acts for."),
    ] = None,
    by: Annotated[
        str,
        typer.Option("--by", envvar="TURNSTILE_MCP_BY",
                     help="Over stdio: who approves or denies, as the run records it."),
    ] = "mcp",
    http: Annotated[
        bool,
        typer.Option("--http", envvar="TURNSTILE_MCP_HTTP",
                     help="Serve streamable HTTP at /mcp, behind the API keys, not stdio."),
    ] = False,
    host: Annotated[
        str, typer.Option("--host", envvar="TURNSTILE_MCP_HOST", help="Address to listen on.")
    ] = "127.0.0.1",
    port: Annotated[
        int, typer.Option("--port", envvar="TURNSTILE_MCP_PORT", min=1, max=65535)
    ] = 8090,
    redis_url: RedisUrl = None,
    broker_url: BrokerUrl = None,
) -> None:  # fmt: skip
    """Serve runs as MCP tools: submit a run, read it and its events, wait for it, approve or
    deny its held call. Over stdio (for a local client) every call acts for --tenant; over
    --http each request's API key names its tenant (a service key reaches its own runs only)."""
    from turnstile.errors import InvalidNameError
    from turnstile.worker.mcp.server import serve_http, serve_stdio
    from turnstile.worker.names import check_name

    if http and tenant is not None:
        fail("--tenant is for stdio: over --http each request's API key names its tenant", code=2)
    if not http and tenant is None:
        fail("give --tenant: over stdio every call acts for one tenant", code=2)
    try:
        check_name("tenant", tenant) if tenant is not None else None
        check_name("user", by)
    except InvalidNameError as exc:
        fail(str(exc), code=2)
    if not redis_url:
        fail("no store: set TURNSTILE_REDIS_URL or pass --redis-url", code=2)
    api = None
    if http:
        from turnstile.worker.http.settings import ApiSettings

        try:
            api = ApiSettings()  # the HTTP API's limits: a body's size, a key's submissions
        except ValueError as exc:
            fail(f"bad setting: {' '.join(str(exc).split())}", code=2)
    with client(redis_url, broker_url) as c:
        if api is not None:
            serve_http(c, host, port, api)
        else:
            assert tenant is not None
            serve_stdio(c, tenant, by)
