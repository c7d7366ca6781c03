"""The API's interactive docs (Swagger UI at /docs): off unless `TURNSTILE_API_DOCS` is set, so
by default no page on the console's origin loads a script from another site.

When on, the page has no inline script (it starts Swagger UI from /docs/init.js, served here),
loads Swagger UI's script and style from `TURNSTILE_API_DOCS_ASSETS_URL` (a CDN by default; a
path such as `/swagger` for a copy of `swagger-ui-dist` the operator serves on this origin),
and its Content-Security-Policy admits that origin and no other. /openapi.json is always served.
"""

from __future__ import annotations

import html
from urllib.parse import urlsplit

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, Response

from turnstile.worker.http.headers import CSP

INIT_JS = (
    "window.ui = SwaggerUIBundle({url: document.body.dataset.openapi, dom_id: '#swagger-ui',"
    " deepLinking: true});\n"
)


def assets_origin(assets_url: str) -> str:
    """What the page's CSP admits besides 'self': the origin of the assets' URL, or nothing
    more for a path on this origin."""
    parts = urlsplit(assets_url)
    return f"{parts.scheme}://{parts.netloc}" if parts.netloc else ""


def policy(assets_url: str) -> str:
    origin = assets_origin(assets_url)
    extra = f" {origin}" if origin else ""
    return f"{CSP}; script-src 'self'{extra}; style-src 'self'{extra}; img-src 'self' data:{extra}"


def install(app: FastAPI, assets_url: str) -> None:
    """/docs and /docs/init.js on `app`, with the assets at `assets_url`."""
    assets = html.escape(assets_url.rstrip("/"), quote=True)
    headers = {"Content-Security-Policy": policy(assets_url)}

    @app.get("/docs", include_in_schema=False)
    def docs_page(request: Request) -> HTMLResponse:
        root = html.escape(str(request.scope.get("root_path", "")), quote=True)
        page = (
            '<!doctype html><html lang="en"><head><meta charset="utf-8">'
            f"<title>{html.escape(app.title)} API</title>"
            f'<link rel="stylesheet" href="{assets}/swagger-ui.css"></head>'
            f'<body data-openapi="{root}/openapi.json"><div id="swagger-ui"></div>'
            f'<script src="{assets}/swagger-ui-bundle.js"></script>'
            f'<script src="{root}/docs/init.js"></script></body></html>'
        )
        return HTMLResponse(page, headers=headers)

    @app.get("/docs/init.js", include_in_schema=False)
    def docs_init() -> Response:
        return Response(INIT_JS, media_type="text/javascript", headers=headers)
