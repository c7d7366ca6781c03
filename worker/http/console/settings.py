"""Settings of the console, from `TURNSTILE_CONSOLE_*` environment variables, typed and frozen."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class ConsoleSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TURNSTILE_CONSOLE_", frozen=True, extra="ignore")

    # How long a login lasts; the session cookie is refused after it, whatever the browser does.
    session_s: int = Field(default=8 * 3600, ge=60, le=30 * 86400)
    # Signs the session cookies. Empty: one random secret is made and kept in the store, so
    # every server behind one load balancer signs with the same one.
    secret: str = ""
    # Send the cookies only over HTTPS (set it when the console is served over HTTPS).
    secure_cookie: bool = False
    rows: int = Field(default=50, ge=1, le=500)  # runs per page of the runs page
    inbox_rows: int = Field(default=20, ge=1, le=200)  # held runs per page of the inbox
