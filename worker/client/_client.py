"""The Python API for services that enqueue work: `Client`, made of its parts by what a service
does with it: submitting (`_submit.py`), conversations (`_conversations.py`), deciding
(`_decide.py`), reading (`_reading.py`) and notes (`_memory.py`), guarded at its edge
(`_edge.py`).

Every input is checked before anything is written: an unknown job, a budget above what the
tenant allows, an oversized goal or params, a tenant, user, queue or run id outside the one
rule for names (worker/names.py) are clear errors.
"""

from __future__ import annotations

from typing import Self

import redis

from turnstile.ledger.client import Ledger
from turnstile.ledger.inputs import DEFAULT_DIMENSIONS
from turnstile.worker.broker.producer import sender
from turnstile.worker.client._conversations import Conversations
from turnstile.worker.client._decide import Deciding
from turnstile.worker.client._edge import guard_store
from turnstile.worker.client._reading import FOLLOW_BLOCK_MS, Reading
from turnstile.worker.client._submit import Send, Submitted, Submitting, idempotent_run_id
from turnstile.worker.registry import Registry
from turnstile.worker.scheduling.fair import route
from turnstile.worker.settings import Settings
from turnstile.worker.store import keys
from turnstile.worker.store.connect import connect
from turnstile.worker.store.durability import check_server
from turnstile.worker.store.memory import RedisMemory
from turnstile.worker.store.runs import RunStore, StoreUnavailable

RUN_TENANTS = keys.RUN_TENANTS  # hash: run id -> tenant (worker/store/submissions.py)

# Kept importable from here: the names services, the HTTP API and the tests import.
__all__ = ["RUN_TENANTS", "Client", "Submitted", "connect_client", "idempotent_run_id"]


@guard_store
class Client(Submitting, Conversations, Deciding, Reading):
    """A service's handle on Turnstile: submit runs, read them, wait for them, follow their
    events, decide on held calls, and keep a tenant's users' long-term notes.

    Made by `connect_client(Settings(redis_url=...))`. It reads and writes the store the
    workers use and sends steps through a private producer: it builds no Celery app of the
    caller's. Every input is checked before anything is written; a refusal is a
    `SubmissionError` (or `DecisionRefusedError`) with a one-line message. A store that cannot
    be reached is a `StoreUnavailableError` naming its URL (the password hidden), from every
    method, the iteration of `events` included. One Client may be shared by the threads of a
    process (its Redis client is a connection pool)."""

    def __init__(self, client: redis.Redis, config: Settings, send: Send) -> None:
        # A durable mode the server cannot give is refused before anything is written.
        check_server(client, config.wait_for)
        # Where a step goes (the broker, or its tenant's pending list): worker/scheduling/fair.py.
        self.client, self.config, self.send = client, config, route(client, config, send)
        self.jobs = Registry.from_settings(
            config, client
        )  # the jobs this process can see: entry points, TURNSTILE_JOBS
        self.ledger = Ledger(
            client, grace_s=config.ledger_grace_s,
            dimensions=(*DEFAULT_DIMENSIONS, *self.jobs.dimensions()),
        )  # fmt: skip
        self.store = RunStore(
            client, self.ledger, wait_for=config.wait_for, jobs=self.jobs,
            pickup_lease_ms=int(config.pickup_lease_s * 1000),
        )  # fmt: skip
        self.store.on_started = self._send_started
        self.memory = RedisMemory(client)
        self.deferred: list[str] = []  # runs whose step the broker did not take (sweeper sends)
        # A blocking read of a run's events ends before the socket's timeout would.
        self.block_ms = max(10, min(FOLLOW_BLOCK_MS, int(config.redis_timeout_s * 1000) - 200))

    def close(self) -> None:
        """Close the client's connections to the store (the ledger and memory share them)."""
        self.client.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def connect_client(config: Settings) -> Client:
    """A client over the configured store, sending steps through the configured broker."""
    if config.redis_url is None:
        raise StoreUnavailable("no store: set TURNSTILE_REDIS_URL")
    return Client(connect(config.redis_url, config), config, sender(config))
