"""What a worker waits for as it starts: its store and its broker answering.

A worker that starts before its store (a compose file's services in any order, a laptop
whose store is not started yet) waits up to TURNSTILE_START_WAIT_S for both to answer; past
that it says, in one line, which one did not, at which URL (password hidden), and what to do,
and exits non-zero, instead of Celery's banner and a hundred retries naming its transport.
A server that answers but refuses the worker (a wrong password, a vhost that is not there),
or a URL that cannot be the store or the broker (a cluster's), is said at once: waiting does
not mend it. A store lost after the start is ridden out as
before: a step retries with backoff until it is back.

`turnstile worker` asks before Celery starts; a worker Celery starts itself asks in its
`ReachHook` (worker/runtime/hooks.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import redis

from turnstile.errors import StoreMismatchError, StoreUnavailableError, redact
from turnstile.worker.broker import amqp
from turnstile.worker.settings import Settings
from turnstile.worker.store.connect import UNAVAILABLE, connect, store_line

POLL_S = 0.5  # between two looks at a server that did not answer
STORE_ADVICE = (
    "start one with `turnstile dev-server` (it prints the URL to set), or set "
    "TURNSTILE_REDIS_URL (--redis-url) to a running Redis or Valkey"
)
BROKER_ADVICE = "start it, or set TURNSTILE_BROKER_URL (--broker-url) to a running broker"


@dataclass(frozen=True)
class Unreached:
    """Why a worker does not start: what did not answer (or refused it), in the client's
    words, and what to do."""

    what: str  # "the store at redis://:***@db:6379/0"
    cause: str  # the client's words: "Error 111 connecting to db:6379. Connection refused"
    advice: str = ""
    refused: bool = False  # it answered and refused (`cause` says so whole): waiting won't help

    def line(self, waited_s: float) -> str:
        """The one line a worker exits with."""
        if self.refused:
            return self.cause
        return f"{self.what} did not answer within {waited_s:g} s ({self.cause}): {self.advice}"

    @property
    def exit_code(self) -> int:
        """2 for a refusal (a restart does not mend it), 1 for a server that did not answer
        (a supervisor's restart may)."""
        return 2 if self.refused else 1


def _cause(exc: BaseException | str) -> str:
    return redact(" ".join(str(exc).split())).rstrip(".")


def _ping(url: str, config: Settings, what: str, advice: str) -> Unreached | None:
    """None when the Redis server at `url` answers a PING; else why not."""
    subject = f"the {what} at {redact(url)}"
    try:
        client = connect(url, config)
    except StoreMismatchError as exc:  # a cluster URL naming a single server, say
        return Unreached(subject, str(exc), refused=True)
    except StoreUnavailableError as exc:  # a cluster none of whose nodes answered
        return Unreached(subject, _cause(exc.__cause__ or exc), advice)
    try:
        client.ping()
    except redis.AuthenticationError as exc:
        said = store_line(exc, url).replace("the store", f"the {what}", 1)
        return Unreached(subject, said, refused=True)
    except UNAVAILABLE as exc:
        return Unreached(subject, _cause(exc), advice)
    finally:
        client.close()
    return None


def _amqp(url: str) -> Unreached | None:
    """None when the RabbitMQ broker takes the worker's login; else why not."""
    try:
        amqp.check(url)
    except amqp.BrokerRefusedError as exc:
        return Unreached(f"the broker at {amqp.safe_url(url)}", str(exc), refused=True)
    except amqp.BrokerError as exc:
        cause = str(exc).partition(" unreachable: ")[2] or str(exc)
        return Unreached(f"the broker at {amqp.safe_url(url)}", _cause(cause), BROKER_ADVICE)
    return None


def _problem(config: Settings) -> Unreached | None:
    store = str(config.redis_url)
    found = _ping(store, config, "store", STORE_ADVICE)
    if found is not None:
        return found
    try:
        broker = config.broker
    except StoreMismatchError as exc:  # a cluster is no broker
        return Unreached("the broker", str(exc), refused=True)
    if amqp.is_amqp(broker):
        return _amqp(broker)
    return None if broker == store else _ping(broker, config, "broker", BROKER_ADVICE)


def wait_reachable(
    config: Settings,
    *,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> Unreached | None:
    """None as soon as the store and the broker answer, within `config.start_wait_s`; else
    why not (a refusal at once, without waiting): `.line(config.start_wait_s)` says it."""
    deadline = clock() + config.start_wait_s
    while True:
        found = _problem(config)
        left_s = deadline - clock()
        if found is None or found.refused or left_s <= 0:
            return found
        sleep(min(POLL_S, left_s))
