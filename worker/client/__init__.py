"""What a service imports: submit runs, read them, wait for them, follow their events, decide
on held calls, keep a tenant's users' notes. No Celery worker side: importing it loads neither
`celery.worker` nor `kombu.transport`, and it publishes through a private producer only when a
step must reach the broker.

    from turnstile.worker.client import Client, connect_client
    client = connect_client(Settings(redis_url="redis://localhost:6379/0"))
"""

from turnstile.errors import (
    ConversationBusyError,
    DecisionRefusedError,
    InvalidEventIdError,
    InvalidNameError,
    QueueNotAllowedError,
    RunNotFoundError,
    SubmissionConflictError,
    SubmissionError,
    SubmissionNameError,
    WaitTimeoutError,
)
from turnstile.worker.client._client import (
    Client,
    Submitted,
    connect_client,
    idempotent_run_id,
)
from turnstile.worker.client._reading import RunEvent
from turnstile.worker.settings import Settings

__all__ = [
    "Client",
    "ConversationBusyError",
    "DecisionRefusedError",
    "InvalidEventIdError",
    "InvalidNameError",
    "QueueNotAllowedError",
    "RunEvent",
    "RunNotFoundError",
    "Settings",
    "SubmissionConflictError",
    "SubmissionError",
    "SubmissionNameError",
    "Submitted",
    "WaitTimeoutError",
    "connect_client",
    "idempotent_run_id",
]
