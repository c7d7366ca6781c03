"""A store that cannot be reached, said one way: `StoreUnavailable`, raised by `reached`."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from turnstile.errors import StoreUnavailableError
from turnstile.worker.store.values import UNAVAILABLE


class StoreUnavailable(StoreUnavailableError):  # noqa: N818 - the store is down, said plainly
    """The run store could not be reached, or none is configured; the caller retries later.
    Nothing was half-written."""


class NotDurableError(StoreUnavailable):
    """A write made but not confirmed where TURNSTILE_DURABILITY wants it (the disk, the
    replicas) in time: a crash of the server now may lose it. A step retries as if the store
    were down (its commit, if it survives, makes the retry a no-op); a caller is told."""


@contextlib.contextmanager
def reached() -> Iterator[None]:
    """Run the block against the store: a server that does not answer, or a cluster in the
    middle of a failover (`values.UNAVAILABLE`), is StoreUnavailable."""
    try:
        yield
    except UNAVAILABLE as exc:
        raise StoreUnavailable(f"store unavailable: {exc}") from exc
