"""`turnstile api`: the app on uvicorn."""

from __future__ import annotations

import uvicorn

from worker.http.app import create_app
from worker.http.settings import ApiSettings
from worker.logs import configure
from worker.settings import Settings


def serve(config: Settings, api_settings: ApiSettings) -> None:
    configure(config.log_format, config.log_level)
    app = create_app(config, api_settings)
    uvicorn.run(
        app, host=api_settings.host, port=api_settings.port, log_level="warning",
        proxy_headers=True, server_header=False,
    )  # fmt: skip
