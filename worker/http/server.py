"""`turnstile api`: the app on uvicorn."""

from __future__ import annotations

import uvicorn
from fastapi import FastAPI

from turnstile.worker.http.app import create_app
from turnstile.worker.http.settings import ApiSettings
from turnstile.worker.observability.logs import configure
from turnstile.worker.settings import Settings


def build(config: Settings, api_settings: ApiSettings) -> FastAPI:
    """The app, with logging set up; a ValueError names a setting that cannot work."""
    configure(config.log_format, config.log_level)
    return create_app(config, api_settings)


def serve(app: FastAPI, api_settings: ApiSettings) -> None:
    uvicorn.run(
        app, host=api_settings.host, port=api_settings.port, log_level="warning",
        proxy_headers=True, server_header=False,
    )  # fmt: skip
