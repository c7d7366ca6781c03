"""Turnstile as an MCP server (`turnstile mcp`): an MCP client (an IDE, a desktop assistant,
another agent) submits runs, reads their status and events, waits for them, and approves or
denies a held call, with the checks of the HTTP API, through the same library functions.

Who is asking decides what it reaches. Over stdio, the operator who starts the server names
the tenant (`--tenant`) and who decides (`--by`), as for the CLI. Over streamable HTTP, every
request carries an API key (`Authorization: Bearer`, `turnstile keys create`): a service key
reaches its own tenant's runs only (another tenant's run is not found), an operator key every
tenant's; a request without a live key is a 401 before any tool runs.

A refusal (an unknown job, bad params, a run that is not found, a decision that does not
apply) is the tool's error result, in one line; the server goes on.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio
import redis
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import ToolAnnotations

from turnstile.errors import TurnstileError, WaitTimeoutError
from turnstile.jobs.errors import KernelError
from turnstile.jobs.tools import one_line
from turnstile.worker.client._client import Client
from turnstile.worker.http import apikeys
from turnstile.worker.http.settings import ApiSettings
from turnstile.worker.names import RUN_ID
from turnstile.worker.ops import decisions, views
from turnstile.worker.store import run_index

T = TypeVar("T")
KEY_STATE = "turnstile_api_key"  # where the HTTP gate leaves the request's key (ASGI state)
MAX_WAIT_S = 300.0  # one wait_run call; a client waits again for longer
MAX_EVENTS = 200  # events one run_events call returns; `after` pages on
READ = ToolAnnotations(read_only_hint=True)
DECIDE = ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=True)


@dataclass(frozen=True)
class Caller:
    """Who a call is for: the tenant it acts as, who decides, and whether every tenant's runs
    are within reach (an operator key)."""

    tenant: str
    by: str
    operator: bool = False
    key_id: str | None = None  # the API key's, whose submissions are counted (HTTP)


def _refused(exc: Exception) -> ToolError:
    return ToolError(one_line(str(exc), 300))


async def _off_loop(fn: Callable[[], T]) -> T:
    """The client's blocking call, on a thread: a wait does not hold the server's loop."""
    try:
        return await anyio.to_thread.run_sync(fn)
    except (TurnstileError, KernelError, ValueError) as exc:
        raise _refused(exc) from None


class Tools:
    """The server's tools over one client; `caller` says who each request is for."""

    def __init__(
        self, client: Client, caller: Callable[[Context], Caller],
        limit: Callable[[str], None] | None = None,
    ) -> None:  # fmt: skip
        self.client, self.caller, self.limit = client, caller, limit

    def run_tenant(self, who: Caller, run_id: str) -> str:
        """The run's tenant, if `who` may see the run: another tenant's run is not found."""
        if not isinstance(run_id, str) or not RUN_ID.fullmatch(run_id):
            raise ToolError(f"no run {run_id!r:.140}")
        if who.operator:
            tenant = run_index.tenant_of(self.client.client, run_id)
            if tenant:
                return tenant
        elif run_index.exists(self.client.client, who.tenant, run_id):
            return who.tenant
        raise ToolError(f"no run {run_id!r}")

    def view(self, who: Caller, run_id: str) -> dict[str, Any]:
        return views.run_view(self.client, run_id, self.run_tenant(who, run_id))

    def submit(self, who: Caller, *, job: str, goal: str, user: str,
               params: dict[str, Any] | None, budget: dict[str, Any] | None, queue: str,
               idempotency_key: str | None, priority: int) -> dict[str, Any]:  # fmt: skip
        if self.limit is not None and who.key_id is not None:
            self.limit(who.key_id)  # the HTTP API's limit on the key's submissions, shared
        made = self.client.submit_run(
            who.tenant, user, job, goal, params or {}, budget=budget, queue=queue,
            idempotency_key=idempotency_key, priority=priority,
        )  # fmt: skip
        return {"run_id": made.run_id, "tenant": who.tenant, "created": made.created,
                "sent": made.sent}  # fmt: skip

    def events(self, who: Caller, run_id: str, after: str | None) -> dict[str, Any]:
        tenant = self.run_tenant(who, run_id)
        got = []
        for event in self.client.events(run_id, after, tenant=tenant, timeout_s=0):
            got.append({"id": event.id, **event.data})
            if len(got) == MAX_EVENTS:
                break
        return {"run_id": run_id, "events": got, "next_after": got[-1]["id"] if got else after}

    def wait(self, who: Caller, run_id: str, timeout_s: float) -> dict[str, Any]:
        tenant = self.run_tenant(who, run_id)
        try:
            self.client.wait(run_id, min(max(0.0, timeout_s), MAX_WAIT_S), tenant=tenant)
        except WaitTimeoutError:
            return {**views.run_view(self.client, run_id, tenant), "waited": "timed_out"}
        return {**views.run_view(self.client, run_id, tenant), "waited": "settled"}

    def approve(self, who: Caller, run_id: str, digest: str) -> dict[str, Any]:
        tenant = self.run_tenant(who, run_id)
        decisions.approve(self.client, run_id, by=who.by, digest=digest, tenant=tenant)
        return views.run_view(self.client, run_id, tenant)

    def deny(self, who: Caller, run_id: str, reason: str) -> dict[str, Any]:
        tenant = self.run_tenant(who, run_id)
        decisions.deny(self.client, run_id, by=who.by, reason=reason, tenant=tenant)
        return views.run_view(self.client, run_id, tenant)


def build(
    client: Client, caller: Callable[[Context], Caller],
    limit: Callable[[str], None] | None = None,
) -> MCPServer:  # fmt: skip
    """The MCP server: its tools over `client`, each acting for `caller(ctx)`; `limit(key_id)`
    counts a key's submission (raising past its limit)."""
    tools = Tools(client, caller, limit)
    server = MCPServer("turnstile", instructions=__doc__.split("\n\n")[0] if __doc__ else None,
                       log_level="WARNING")  # fmt: skip

    async def run(ctx: Context, fn: Callable[[Caller], T]) -> T:
        who = tools.caller(ctx)
        return await _off_loop(lambda: fn(who))

    @server.tool()
    async def submit_run(
        ctx: Context, *, job: str, goal: str, user: str, params: dict[str, Any] | None = None,
        budget: dict[str, Any] | None = None, queue: str = "default",
        idempotency_key: str | None = None, priority: int = 5,
    ) -> dict[str, Any]:  # fmt: skip
        """Submit a run of a job for one of the tenant's users; returns its run_id. The same
        idempotency_key (a key of the tenant's own) names the same run again."""
        return await run(ctx, lambda who: tools.submit(
            who, job=job, goal=goal, user=user, params=params, budget=budget, queue=queue,
            idempotency_key=idempotency_key, priority=priority))  # fmt: skip

    @server.tool(annotations=READ)
    async def get_run(run_id: str, ctx: Context) -> dict[str, Any]:
        """A run: its status, outcome and reason, usage against budget, plan, and the call it
        holds for approval (with the digest to approve it by)."""
        return await run(ctx, lambda who: tools.view(who, run_id))

    @server.tool(annotations=READ)
    async def run_events(run_id: str, ctx: Context, after: str | None = None) -> dict[str, Any]:
        """A run's stored events in order (at most 200), after the event id `after`; pass
        `next_after` back for the next ones."""
        return await run(ctx, lambda who: tools.events(who, run_id, after))

    @server.tool(annotations=READ)
    async def wait_run(run_id: str, ctx: Context, timeout_s: float = 30.0) -> dict[str, Any]:
        """Wait (up to timeout_s, at most 300) until the run stops or waits for a person; the
        run as it is then, with `waited`: settled or timed_out."""
        return await run(ctx, lambda who: tools.wait(who, run_id, timeout_s))

    @server.tool(annotations=DECIDE)
    async def approve_call(run_id: str, digest: str, ctx: Context) -> dict[str, Any]:
        """Approve exactly the call the run holds, by its digest (from get_run's `pending`);
        the run goes on."""
        return await run(ctx, lambda who: tools.approve(who, run_id, digest))

    @server.tool(annotations=DECIDE)
    async def deny_call(run_id: str, reason: str, ctx: Context) -> dict[str, Any]:
        """Deny the call the run holds, saying why: the run ends approval_denied (or its job
        shows the model the denial)."""
        return await run(ctx, lambda who: tools.deny(who, run_id, reason))

    return server


# -- streamable HTTP behind the API keys ---------------------------------------------------------

Asgi = Callable[[dict[str, Any], Any, Any], Awaitable[None]]


def key_gate(app: Asgi, store: redis.Redis) -> Asgi:
    """Every HTTP request carries a live API key, or is a 401 problem document; the key is
    left in the request's state for the tools."""

    async def gate(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        scheme, _, secret = headers.get(b"authorization", b"").decode(errors="replace").partition(
            " "
        )  # fmt: skip
        key = None
        if scheme.lower() == "bearer" and secret:
            key = await anyio.to_thread.run_sync(apikeys.verify, store, secret.strip())
        if key is None:
            said = "send a live API key: Authorization: Bearer <key>"
            await _problem(send, 401, "invalid_key" if secret else "missing_key", said)
            return
        scope.setdefault("state", {})[KEY_STATE] = key
        await app(scope, receive, send)

    return gate


async def _problem(send: Any, status: int, title: str, detail: str) -> None:
    body = json.dumps({"type": "about:blank", "title": title, "status": status,
                       "detail": detail}).encode()  # fmt: skip
    headers = [(b"content-type", b"application/problem+json"), (b"www-authenticate", b"Bearer")]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def http_caller(ctx: Context) -> Caller:
    """The caller an HTTP request's key makes."""
    request = ctx.request_context.request
    state = getattr(request, "scope", {}).get("state", {}) if request is not None else {}
    key = state.get(KEY_STATE)
    if not isinstance(key, apikeys.ApiKey):  # the gate refuses such a request first
        raise ToolError("no API key")
    return Caller(key.tenant, key.name, key.operator, key.id)


def serve_http(client: Client, host: str, port: int, api: ApiSettings) -> None:
    """Serve the tools over streamable HTTP at /mcp, behind the API keys, with the HTTP API's
    limits (TURNSTILE_API_*): a request body's size, and a key's submissions per window,
    counted with its submissions to the HTTP API."""
    import uvicorn  # noqa: PLC0415 - only the HTTP server needs it

    from turnstile.worker.http.ratelimit import RateLimiter  # noqa: PLC0415

    limiter = RateLimiter(client.client, limit=api.submits_per_window, window_s=api.rate_window_s)
    server = build(client, http_caller, limiter.take)
    served = server.streamable_http_app(host=host, max_request_body_size=api.max_body_bytes)
    app = key_gate(served, client.client)
    uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning")).run()


def serve_stdio(client: Client, tenant: str, by: str) -> None:
    """Serve the tools over stdin and stdout, every call for `tenant`, decided as `by`."""
    who = Caller(tenant, by)
    build(client, lambda ctx: who).run("stdio")
