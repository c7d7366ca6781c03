"""The FastAPI application: built by `create_app`, never on import.

Stateless: every request reads the shared store, so several servers can stand behind one load
balancer; only the webhook deliverer coordinates, through a lease in the store.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI
from fastapi.responses import RedirectResponse

from turnstile.worker.broker.producer import sender
from turnstile.worker.client._client import Client
from turnstile.worker.http import (
    context,
    docs,
    problems,
    routes_evals,
    routes_limits,
    routes_ops,
    routes_runs,
    webhook_delivery,
)
from turnstile.worker.http import routes_webhooks as webhooks
from turnstile.worker.http.console import pages as console
from turnstile.worker.http.context import Api
from turnstile.worker.http.headers import SecurityHeaders
from turnstile.worker.http.problems import response
from turnstile.worker.http.ratelimit import RateLimiter
from turnstile.worker.http.settings import ApiSettings
from turnstile.worker.http.streams import StreamSlots
from turnstile.worker.settings import Settings
from turnstile.worker.store.connect import UNAVAILABLE, check, connect, connect_async
from turnstile.worker.store.runs import StoreUnavailable

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class TurnstileApp(FastAPI):
    """The FastAPI app with the security headers outermost: around Starlette's handler of last
    resort too, so the answer to a bug carries them like every other response."""

    def build_middleware_stack(self) -> ASGIApp:
        return SecurityHeaders(super().build_middleware_stack())


class BodyCap:
    """Refuse a request body above the cap with 413 before any route reads it: by its
    Content-Length when it has one, and by reading it (up to the cap) when it is chunked."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None:
            if not length.isdigit() or int(length) > self.max_bytes:
                await self._refuse(scope, receive, send)
            else:
                await self.app(scope, receive, send)
            return
        body = await self._read(receive)
        if body is None:
            await self._refuse(scope, receive, send)
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()  # a disconnect, for a streaming response
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)

    async def _read(self, receive: Receive) -> bytes | None:
        """The whole chunked body, or None once it passes the cap."""
        chunks: list[bytes] = []
        total = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return b"".join(chunks)
            chunk = message.get("body", b"")
            total += len(chunk)
            if total > self.max_bytes:
                return None
            chunks.append(chunk)
            if not message.get("more_body"):
                return b"".join(chunks)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        answer = response(413, "body_too_large", f"the body is over {self.max_bytes} bytes")
        await answer(scope, receive, send)


def create_app(config: Settings, api_settings: ApiSettings | None = None) -> FastAPI:
    """The API over the configured store and broker."""
    api_settings = api_settings or ApiSettings()
    if config.redis_url is None:
        raise StoreUnavailable("no store: set TURNSTILE_REDIS_URL")
    store = connect(config.redis_url, config)
    client = Client(store, config, sender(config))
    limiter = RateLimiter(
        store, limit=api_settings.submits_per_window, window_s=api_settings.rate_window_s
    )
    with contextlib.suppress(*UNAVAILABLE):  # a store that is down: each request says so
        check(store, config.redis_url, config)  # the URL and the server agree
    streams = connect_async(config.redis_url, config)
    # One XREAD blocks at most this long, inside the store client's own timeout.
    block_ms = min(api_settings.sse_block_ms, int(config.redis_timeout_s * 1000) - 500)
    slots = StreamSlots(
        store, streams, cap=api_settings.sse_streams_per_key, block_ms=max(block_ms, 10)
    )
    api = Api(client, api_settings, limiter, streams, slots)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        with webhook_delivery.background(store, api_settings):
            yield
        await streams.aclose()

    app = TurnstileApp(
        title="Turnstile",
        version="1",
        summary="Runs, live events, decisions and webhooks for long LLM agent runs.",
        lifespan=lifespan,
        # No redirect from /v1/runs/ to /v1/runs: Starlette's would build its Location from the
        # request's Host header. A path with a trailing slash is a 404 problem like any other.
        redirect_slashes=False,
        dependencies=[Depends(context.strict_query)],
        docs_url=None,  # docs.install serves /docs when asked, without third-party scripts
        redoc_url=None,
    )
    app.state.api = api
    problems.install(app)
    app.include_router(routes_runs.router)
    app.include_router(routes_evals.router)
    app.include_router(routes_ops.router)
    app.include_router(routes_limits.router)
    app.include_router(webhooks.router)
    if api_settings.docs:
        docs.install(app, api_settings.docs_assets_url)

    @app.get("/console", include_in_schema=False)
    def console_home() -> RedirectResponse:
        return RedirectResponse("/console/runs", status_code=303)

    app.mount("/console", console.create(api))  # the browser's console: worker/http/console
    app.add_middleware(BodyCap, max_bytes=api_settings.max_body_bytes)
    return app
