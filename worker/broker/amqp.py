"""RabbitMQ as the broker (`TURNSTILE_BROKER_URL=amqp://...`): the Celery settings that put
quorum queues and publisher confirms in place, the check a worker and an operator command make
before they rely on the broker (one line for wrong credentials, a missing vhost, a host that
does not answer), and a queue's depth read with a passive `queue.declare`.

Quorum queues change three things Turnstile relies on with the Redis broker:

- No global QoS: Celery detects the quorum queues (`worker_detect_quorum_queues`) and sets a
  static prefetch per consumer (prefetch multiplier 1 times the pool's size), so a worker still
  holds only the turns it can run.
- No priorities on RabbitMQ 3 (two levels on RabbitMQ 4: 5 and above is high). Turnstile
  orders steps in its own per-tenant pending lists before they reach the broker, and the
  dispatcher keeps the broker's queue short, so the broker's order matters little; a step's
  priority is sent the AMQP way round (a run's next step high, a new run's first step low),
  which RabbitMQ 4 honours and RabbitMQ 3 ignores.
- No ETA held in the worker without a cost: a message with a countdown would take one of the
  worker's fixed prefetch slots until it is due. A step retried because the store or the
  ledger is down uses a countdown, so the queues use topic exchanges and Celery's native
  delayed delivery (`celery_delayed_*` queues of RabbitMQ's own) holds it instead.

Delivery is at least once, as on Redis: a lost connection or a killed worker returns its
unacked steps to the queue at once (on Redis, after the visibility timeout), and the version
compare-and-set in the store makes every extra delivery a no-op.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from types import TracebackType
from typing import Any

from turnstile.errors import TurnstileError

AMQP_SCHEMES = ("amqp://", "amqps://", "pyamqp://")
CHECK_TIMEOUT_S = 5.0


class BrokerError(TurnstileError):
    """The broker cannot be used: what is wrong, in one line."""


class BrokerRefusedError(BrokerError):
    """The broker answered and refused: wrong credentials, or a vhost that is not there or not
    open to the user. No retry mends it."""


class BrokerUnreachableError(BrokerError):
    """Nothing answered at the broker's address in time."""


def is_amqp(url: str | None) -> bool:
    return bool(url) and str(url).startswith(AMQP_SCHEMES)


def safe_url(url: str) -> str:
    """The URL without its password, for a message."""
    from kombu.utils.url import maybe_sanitize_url  # noqa: PLC0415 - kombu only for AMQP

    return str(maybe_sanitize_url(url))


def celery_config() -> dict[str, Any]:
    """Celery's settings for a RabbitMQ broker (merged into the app's by `make_app`)."""
    return {
        # Every queue a worker consumes or a producer sends to is declared a quorum queue:
        # the default one, and the ones made on first use (each Turnstile queue).
        "task_default_queue_type": "quorum",
        "task_create_missing_queue_type": "quorum",
        # Topic exchanges, so a countdown goes through RabbitMQ's delayed delivery queues
        # (Celery does not route a direct exchange's delayed message there).
        "task_default_exchange_type": "topic",
        "task_create_missing_queue_exchange_type": "topic",
        "broker_native_delayed_delivery_queue_type": "quorum",
        # Global QoS off (quorum queues refuse it), prefetch static per consumer.
        "worker_detect_quorum_queues": True,
        # A turn whose connection dropped runs on and commits; its step, back on the queue,
        # finds the version moved and does nothing (Celery's default, said out loud).
        "worker_cancel_long_running_tasks_on_connection_loss": False,
    }


def transport_options() -> dict[str, Any]:
    """kombu's py-amqp transport options: every publish waits for the broker's confirm, so a
    step the broker did not take raises in its sender instead of being lost."""
    return {"confirm_publish": True}


def _connection(url: str, timeout_s: float) -> Any:
    from kombu import Connection  # noqa: PLC0415 - kombu only for AMQP

    return Connection(
        url,
        connect_timeout=timeout_s,
        transport_options={"read_timeout": timeout_s, "write_timeout": timeout_s},
    )


def _refusal(url: str, exc: BaseException) -> BrokerError:
    """The one line for a failed connection attempt."""
    import amqp  # noqa: PLC0415 - py-amqp only for AMQP

    where = safe_url(url)
    if isinstance(exc, amqp.exceptions.AccessRefused):
        return BrokerRefusedError(f"broker {where} refused the login: wrong user or password")
    if isinstance(exc, amqp.exceptions.NotAllowed):
        reply = str(getattr(exc, "reply_text", "") or exc)
        return BrokerRefusedError(f"broker {where} refused the vhost: {reply}")
    if isinstance(exc, amqp.exceptions.AMQPError):
        return BrokerRefusedError(f"broker {where} refused the connection: {exc}")
    cause = exc.__cause__ or exc.__context__ or exc
    return BrokerUnreachableError(f"broker {where} unreachable: {cause}")


def check(url: str, timeout_s: float = CHECK_TIMEOUT_S) -> str:
    """Connect once and open a channel; the server's version, or a BrokerError whose message
    is the one line to show."""
    conn = _connection(url, timeout_s)
    try:
        conn.ensure_connection(max_retries=1, timeout=timeout_s)
        conn.channel().close()
        return str(conn.connection.server_properties.get("version", "?"))
    except Exception as exc:  # what py-amqp and kombu raise is sorted by _refusal
        raise _refusal(url, exc) from None
    finally:
        conn.release()


class QueueDepth:
    """Messages ready on a RabbitMQ queue (`message_count` of a passive `queue.declare`: the
    ones not yet delivered, as LLEN counts them on Redis), over one connection and channel
    kept open: one round trip per read. A queue not declared yet holds nothing. `name` gives
    the broker's name of the queue asked for (layout.py passes `broker_queue`)."""

    def __init__(
        self,
        url: str,
        timeout_s: float = CHECK_TIMEOUT_S,
        name: Callable[[str], str] = str,
    ) -> None:
        self.url, self.timeout_s, self.name = url, timeout_s, name
        self._conn: Any = None
        self._channel: Any = None

    def __call__(self, queue: str) -> int:
        import amqp  # noqa: PLC0415 - py-amqp only for AMQP

        if self._channel is None:
            if self._conn is None:
                self._conn = _connection(self.url, self.timeout_s)
            try:
                self._conn.ensure_connection(max_retries=1, timeout=self.timeout_s)
                self._channel = self._conn.channel()
            except Exception as exc:  # sorted by _refusal
                self.close()
                raise _refusal(self.url, exc) from None
        try:
            _, count, _ = self._channel.queue_declare(queue=self.name(queue), passive=True)
            return int(count)
        except amqp.exceptions.NotFound:  # the server closed the channel with the 404
            self._channel = None
            return 0
        except Exception as exc:  # the connection is dropped and made again next time
            self.close()
            raise _refusal(self.url, exc) from None

    def close(self) -> None:
        conn, self._conn, self._channel = self._conn, None, None
        if conn is not None:
            with contextlib.suppress(Exception):  # a connection that is gone is released
                conn.release()

    def __enter__(self) -> QueueDepth:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
