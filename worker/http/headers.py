"""The security headers, on every response the server sends: the API's documents, the console's
pages and static files, redirects, 404s and the 500s of a bug.

`SecurityHeaders` wraps the whole app, outside Starlette's own handler of last resort (see
`app.TurnstileApp`), so even the response it sends for an unexpected error carries them. A
response may set its own Content-Security-Policy, Referrer-Policy or Cache-Control (the API
docs' page names the origin of its assets; an event stream is `no-cache`); `nosniff` and
`X-Frame-Options` are never left to a route.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from starlette.datastructures import MutableHeaders

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# Scripts, styles, images and connections from this origin only (the console's own files, its
# event streams); no framing; forms post only here.
CSP = "default-src 'self'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'"
ALWAYS = {"X-Content-Type-Options": "nosniff", "X-Frame-Options": "DENY"}
DEFAULTS = {
    "Content-Security-Policy": CSP,
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",  # runs, keys and decisions are not for a shared cache
}


class SecurityHeaders:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in ALWAYS.items():
                    headers[name] = value
                for name, value in DEFAULTS.items():
                    headers.setdefault(name, value)
            await send(message)

        await self.app(scope, receive, with_headers)
