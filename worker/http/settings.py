"""Settings of the HTTP API, from `TURNSTILE_API_*` environment variables, typed and frozen.
The store and broker come from the worker's own settings (`TURNSTILE_REDIS_URL`, ...)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from turnstile.worker.http.targets import Policy


class ApiSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TURNSTILE_API_", frozen=True, extra="ignore")

    host: str = "127.0.0.1"  # loopback unless told otherwise: the API is not public by default
    port: int = Field(default=8080, ge=0, le=65535)
    # A submission is a goal (4000 chars) and params (16 KiB) at most; 64 KiB leaves room for
    # JSON escaping and a budget, and nothing else the API takes is larger.
    max_body_bytes: int = Field(default=64 * 1024, ge=1024)
    # Submissions per key per window (and as many memory writes, counted apart): a fixed
    # window is enough to stop a runaway client, and costs one script call.
    submits_per_window: int = Field(default=600, ge=1)
    rate_window_s: int = Field(default=60, ge=1)
    # How long one XREAD of an event stream blocks: an SSE connection sends a comment line this
    # often while a run is quiet, so proxies keep it open and a gone client is noticed.
    sse_block_ms: int = Field(default=5000, ge=10, le=30_000)
    # Event streams one key may hold open at once, across every server: each holds a store
    # connection while it lasts. Beyond it a new stream is a 429 with Retry-After.
    sse_streams_per_key: int = Field(default=20, ge=1)
    page_limit: int = Field(default=100, ge=1, le=1000)  # runs per page unless asked
    # Webhooks: the deliverer's tick, one delivery's timeout, how long a delivery is retried,
    # and how many are in flight at once (so a slow endpoint holds one slot, not the loop).
    webhooks: bool = True  # `turnstile api` runs the deliverer as a background task
    webhook_tick_s: float = Field(default=0.5, gt=0)
    webhook_timeout_s: float = Field(default=5.0, gt=0)
    webhook_retry_for_s: float = Field(default=3600.0, gt=0)
    webhook_backoff_base_s: float = Field(default=1.0, gt=0)
    webhook_backoff_max_s: float = Field(default=300.0, gt=0)
    webhook_concurrency: int = Field(default=16, ge=1)
    # Deliveries one tenant may have in flight: a quarter of the pool, so a tenant whose
    # endpoints never answer holds 4 threads for their timeout and every other tenant's
    # delivery still finds one free (three such tenants at once leave the pool a quarter).
    webhook_tenant_concurrency: int = Field(default=4, ge=1)
    # An endpoint's breaker: this many failed attempts in a row (timeouts, errors, 5xx) and it
    # gets nothing for the cool-down, then one trial. 5 tries of 5 s is 25 s of one thread, and
    # 30 s is about where one delivery's backoff stands after 5 failures anyway; its waiting
    # deliveries are kept, and given up after webhook_retry_for_s as ever.
    webhook_breaker_failures: int = Field(default=5, ge=1)
    webhook_breaker_cooldown_s: float = Field(default=30.0, gt=0)
    # Only http(s) URLs; plain http is for tests and internal services, so it is allowed
    # unless this says otherwise.
    webhook_https_only: bool = False
    # Webhooks reach public addresses only (see worker.http.targets); these comma-separated
    # host names and CIDRs are admitted besides, for internal receivers the operator trusts.
    webhook_allow: str = ""
    # Names looked up in this hosts(5)-style file before DNS; its answers are checked alike.
    webhook_hosts_file: Path | None = None

    # The interactive API docs (/docs): off, so no page of this origin loads a script from
    # another site unless an operator asks; on, Swagger UI's script and style come from
    # docs_assets_url (a path such as /swagger for a copy served on this origin).
    docs: bool = False
    docs_assets_url: str = "https://cdn.jsdelivr.net/npm/swagger-ui-dist@5"

    @field_validator("docs_assets_url")
    @classmethod
    def _assets_url(cls, value: str) -> str:
        if value.startswith(("https://", "http://")) or (
            value.startswith("/") and not value.startswith("//")
        ):
            return value
        raise ValueError("docs_assets_url must be an http(s) URL or a path on this server")

    @field_validator("webhook_allow")
    @classmethod
    def _allow_list(cls, value: str) -> str:
        Policy.parse(value)  # a bad entry stops the server at start, not the first delivery
        return value
