"""Settings, built once at the edge from `TURNSTILE_*` environment variables and the command
line's flags, typed and frozen, and passed in: the worker, the client and the HTTP API are
each built from a Settings value; there is no global one to read.

This is the one module of the package that reads the environment for its configuration
(`tests/unit/test_environment_edge.py` holds the rule): every `TURNSTILE_*` variable is a field
here (the HTTP API's and the console's own are fields of `http/settings.py` and
`http/console/settings.py`, read the same way), and the providers' own variables (their keys and
base URLs, named by the SDKs or by a named endpoint) are copied once, when a Settings is built,
into the `ProviderConfig` it hands the providers (`providers`).
"""

from __future__ import annotations

import os
from typing import Any, Literal

from pydantic import Field, PrivateAttr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from turnstile.errors import InvalidNameError, StoreMismatchError
from turnstile.ledger.client import cluster_seed
from turnstile.providers.config import ProviderConfig
from turnstile.worker.names import ANY_QUEUE, check_name, split_names
from turnstile.worker.store.durability import Durability, WaitFor


class Settings(BaseSettings):
    """Turnstile's configuration: every field is also the environment variable TURNSTILE_
    followed by its name in capitals (`redis_url`: TURNSTILE_REDIS_URL). Give a client the
    store's URL at least: `connect_client(Settings(redis_url="redis://..."))`."""

    model_config = SettingsConfigDict(env_prefix="TURNSTILE_", frozen=True, extra="ignore")

    redis_url: str | None = None  # the store and the ledger; None: local commands embed one
    broker_url: str | None = None  # Celery's broker; defaults to the store's server
    default_queue: str = "default"
    # The queues a client (a service, `turnstile submit`, the HTTP API) may submit to, for a
    # tenant without a list of its own (`turnstile tenants set T queues=a,b`): empty, the
    # queues the workers serve (each worker registers its queues in the store as it starts)
    # and the default queue; a comma-separated list, exactly those; `*`, any queue name
    # (nothing is checked: for development and tests). A queue refused is one line, nothing
    # written (worker/store/queues.py).
    submit_queues: str = ""

    # A step's hard time limit is the run's remaining active time plus this grace, so a call
    # that ignores its own timeout is still stopped from outside; the soft limit is a little
    # shorter, so the step can record the deadline before it is killed.
    step_grace_s: float = Field(default=10.0, gt=0)
    soft_margin_s: float = Field(default=2.0, gt=0)
    # The longest active time a run may ask for; with the grace it bounds every hard limit,
    # and the broker's visibility timeout is set above that.
    max_deadline_s: float = Field(default=3600.0, gt=0)

    # A run whose lease lapses without a commit is re-enqueued by the sweeper. A queued step
    # gets `pickup_lease_s` to start; a running one `inflight_lease_s`, renewed by a heartbeat.
    pickup_lease_s: float = Field(default=60.0, gt=0)
    inflight_lease_s: float = Field(default=15.0, gt=0)
    sweep_interval_s: float = Field(default=5.0, gt=0)
    # A worker's claim of its jobs' versions lapses this long after its last heartbeat (a
    # third of it): a killed worker stops counting as serving its versions within it, and a
    # run waiting for a version is taken back within a third of it once a worker serves it.
    version_ttl_s: float = Field(default=15.0, gt=0)
    # A step whose delivery has killed its worker this many times ends the run `error`.
    max_step_attempts: int = Field(default=3, ge=1)
    # Backoff for a step that finds the store or the ledger unreachable.
    retry_base_s: float = Field(default=0.5, gt=0)
    retry_max_s: float = Field(default=30.0, gt=0)

    # A finished run (its hash, events, index entries) is removed this long after it ended:
    # days to read, watch and replay it, without the store growing for good. Until then a
    # run id submitted again is the same run; after, it is a new one.
    retain_finished_s: float = Field(default=3 * 86400.0, ge=0)
    # How often the retention pass runs (one worker's sweeper at a time): old runs, and the
    # ledger's period buckets that have ended.
    retention_interval_s: float = Field(default=60.0, gt=0)

    # Live output (docs/live.md): a turn's answer as the model writes it, its tool calls
    # starting and ending and their progress notes, in a stream per run apart from its
    # events. On: a provider model is called streaming (usage and result as without).
    live_output: bool = True
    # The live stream's bound, in entries (XADD MAXLEN ~): a reader that never reads costs
    # the store at most this, the worker and the server nothing.
    live_max_entries: int = Field(default=2000, ge=10)
    # The answer's words are written at most this often, or sooner when this many characters
    # wait (about thirty tokens): a reader sees them within tens of ms, the store a few
    # dozen writes a second per turn at most.
    live_flush_ms: int = Field(default=30, ge=1, le=1000)
    live_flush_chars: int = Field(default=120, ge=1)

    ledger_grace_s: float = Field(default=60.0, ge=0)
    redis_timeout_s: float = Field(default=5.0, gt=0)
    # How long a starting worker waits for its store and broker to answer before it exits
    # non-zero with one line saying which did not (worker/runtime/reach.py): long enough for
    # a compose file's store to start beside it, short enough that a worker pointed at
    # nothing says so before its operator gives up on it. 0: one look.
    start_wait_s: float = Field(default=30.0, ge=0)

    # The worker's pool and its turns in flight (`turnstile worker --pool --concurrency`; see
    # worker/runtime/pools.py). They size the connection pools: one Redis connection and one broker
    # producer per turn in flight on a green worker.
    pool: str = "prefork"
    concurrency: int = Field(default=2, ge=1)
    # A green worker whose hub has not run for this long kills itself (worker/runtime/pools.py): a
    # turn that blocks the hub holds every other turn of the process. Below the grace, so the
    # other turns' hard limits are still kept within it.
    hub_block_limit_s: float = Field(default=8.0, gt=0)

    # What a submission, a decision and a step's commit must reach before they are
    # acknowledged: none (the server's memory), aof (its fsynced append-only file: WAITAOF, on
    # a server with appendfsync always), replica (that many replicas: WAIT). See
    # worker/store/durability.py and docs/durability.md. `none` here because `aof` refuses to
    # start against a server without AOF (a plain redis-server, the demo's and most tests'
    # embedded one); the deploy files, whose server runs AOF with appendfsync always, set `aof`.
    durability: Durability = Durability.NONE
    durability_replicas: int = Field(default=1, ge=1)
    # Below redis_timeout_s, so the wait answers before the socket gives up on it.
    durability_timeout_s: float = Field(default=2.0, gt=0)

    # Submission limits: what one run may carry and ask for.
    max_goal_chars: int = 4000
    max_params_bytes: int = 16 * 1024

    # Chaos drills, for proving the failure table (docs/concepts.md) in a staging system; both
    # off by default.
    # Every step message is sent this many times (duplicate deliveries), and every n-th send
    # is dropped as if the worker died between its commit and its enqueue.
    chaos_send_copies: int = Field(default=1, ge=1, le=5)
    chaos_drop_every: int = Field(default=0, ge=0)

    # Failure drills a run may ask for in its params (the support job's `die_in`, `sleep_s`,
    # `model_sleep_s`: kill the worker, hang a tool or the model). Off: a submission asking for
    # one is refused and a worker ignores them. Tests, the demo and staging turn them on.
    allow_drills: bool = False

    # Fair share between tenants (worker/scheduling/fair.py): steps wait in per-tenant lists and one
    # dispatcher feeds the queue round robin between tenants, honouring each tenant's cap on
    # turns in flight. Off: every step goes straight to the broker, first come first served.
    fair_share: bool = True
    # How many steps the dispatcher keeps waiting on a queue's broker list, at least: enough
    # that no worker waits for the dispatcher, few enough that a newcomer's step is near the
    # front. It grows to a quarter of the turns the queue's live workers can hold in flight
    # (each announces its pool's limit), so hundreds of green slots fill in few passes, and
    # deeper still while the workers empty it between two passes (dispatcher.py, `Depths`).
    dispatch_depth: int = Field(default=16, ge=1, le=10_000)
    # Eager continuation: a turn whose commit queues its run's next step may run that step at
    # once, in the same worker, while fair share would pick it anyway (no other tenant waiting
    # on the queue, the tenant under its caps, nothing paused or draining), for at most this
    # many turns in a row before the step goes through the queue. 0: every step is queued.
    eager_turns: int = Field(default=8, ge=0)
    # Priorities (0-9, higher first) order a tenant's pending steps; a waiting step gains one
    # level per this many seconds it has waited, so a low one is never starved by a steady
    # stream of higher ones (fair_lib.lua; docs/scheduling.md gives the bound). A large value:
    # strict.
    priority_aging_s: float = Field(default=30.0, gt=0)
    # The dispatcher also wakes this often without a nudge (a slot that lapsed, a lost nudge).
    dispatch_poll_s: float = Field(default=0.5, gt=0, le=60)

    # Celery's task events (task-sent, -received, -started, -succeeded), for Flower or
    # `celery events`: each is one more publish to the broker per step, 4 in all, for events
    # nothing of Turnstile reads (its own are the run's stream and the metrics). Off, as in
    # Celery; turn on to watch the workers with Celery's tools.
    task_events: bool = False

    # Port of the worker's Prometheus endpoint, served by its main process; None or 0: off.
    metrics_port: int | None = None

    log_format: Literal["auto", "json", "console"] = "auto"
    log_level: str = "INFO"

    # MCP servers of the jobs (worker/mcp/): a session's handshake and first listing must come
    # within this; a server that did not answer is tried again no sooner than `mcp_retry_s`
    # later, its calls failing at once meanwhile, with the reason.
    mcp_connect_timeout_s: float = Field(default=10.0, gt=0)
    mcp_retry_s: float = Field(default=15.0, gt=0)
    # A JSON file of the MCP servers' secrets, read by each worker process when it starts:
    # {"<server>": {"*": {...}, "<tenant>": {...}}}, headers of an HTTP server, environment
    # variables of a stdio one ("*" for every tenant; a tenant's own for a per_tenant server).
    mcp_secrets_file: str | None = None

    # The jobs registered beyond the `turnstile.jobs` entry points: `module:attr[,module:attr]`
    # (worker/registry.py).
    jobs: str = ""
    # Models (providers/): more endpoints, as a JSON object or the path of a JSON file of one
    # (providers/endpoints.py); a JSON file of prices that replaces or adds to the shipped table.
    model_endpoints: str = ""
    prices_file: str | None = None
    # A collector's base URL: each turn's spans are exported over OTLP/HTTP
    # (worker/observability/tracing.py); None or empty: off.
    otlp_endpoint: str | None = None

    # The process's environment as it was when these settings were built: where the providers'
    # own variables are read (see the module's docstring).
    _environ: dict[str, str] = PrivateAttr(default_factory=dict)
    _providers: ProviderConfig | None = PrivateAttr(default=None)

    def model_post_init(self, context: Any) -> None:
        """Copy the process's environment once, as the fields were read: the providers' keys
        and base URLs are looked up in this copy, never in the environment again."""
        self._environ = dict(os.environ)

    @property
    def providers(self) -> ProviderConfig:
        """What the providers are configured with: the named endpoints, the prices file, and
        the providers' keys and base URLs as the environment held them when these settings
        were built. Made once (a turn asks for it, gates.py), and again only for a copy of
        these settings whose fields differ."""
        made = self._providers
        if made is None or (made.endpoints, made.prices_file) != (
            self.model_endpoints,
            self.prices_file,
        ):
            made = self._providers = ProviderConfig(
                self.model_endpoints, self.prices_file, environ=self._environ
            )
        return made

    @model_validator(mode="after")
    def _queue_names(self) -> Settings:
        try:
            check_name("queue", self.default_queue)
            if self.submit_queues.strip() != ANY_QUEUE:
                for name in split_names(self.submit_queues):
                    check_name("queue", name)
        except InvalidNameError as exc:
            raise ValueError(str(exc)) from None
        return self

    @property
    def submit_queue_names(self) -> frozenset[str] | None:
        """The queues TURNSTILE_SUBMIT_QUEUES names; None when it names none (the served
        queues apply), the empty set never; ANY_QUEUE alone for `*`."""
        if self.submit_queues.strip() == ANY_QUEUE:
            return frozenset({ANY_QUEUE})
        return frozenset(split_names(self.submit_queues)) or None

    @model_validator(mode="after")
    def _wait_fits_socket(self) -> Settings:
        waits = self.durability is not Durability.NONE
        if waits and self.durability_timeout_s >= self.redis_timeout_s:
            raise ValueError(
                f"durability_timeout_s ({self.durability_timeout_s:g}) must be below "
                f"redis_timeout_s ({self.redis_timeout_s:g})"
            )
        return self

    @property
    def wait_for(self) -> WaitFor:
        """The wait each acknowledged write of the store makes (TURNSTILE_DURABILITY)."""
        return WaitFor(self.durability, self.durability_replicas, self.durability_timeout_s)

    @property
    def broker(self) -> str:
        """Celery's broker URL: TURNSTILE_BROKER_URL, else the store's."""
        url = self.broker_url or self.redis_url
        if url is None:
            raise ValueError("no broker: set TURNSTILE_BROKER_URL or TURNSTILE_REDIS_URL")
        if cluster_seed(url) is not None:
            raise StoreMismatchError(
                "a cluster is no broker (kombu's Redis transport needs one server): set "
                "TURNSTILE_BROKER_URL to a single Redis/Valkey server or to RabbitMQ"
            )
        return url

    @property
    def visibility_timeout_s(self) -> int:
        """Above the longest hard time limit a step can have, so the broker never hands a
        running step to a second worker."""
        return int(self.max_deadline_s + self.step_grace_s + 60)
