"""The client's edge: whatever public method of `Client` meets a store that cannot be reached
raises StoreUnavailableError naming the store by its URL (password hidden), never the store
client's own ConnectionError or TimeoutError, so a service that catches `TurnstileError`
catches it. One place for every method (`guard_store`), not a try in each: a method added
to the Client later is guarded too, and the iterator `events` returns is guarded as it is
iterated."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Generator, Iterator
from typing import Any, TypeVar

from turnstile.errors import StoreUnavailableError, redact
from turnstile.worker.store.connect import UNAVAILABLE, unreachable
from turnstile.worker.store.runs import NotDurableError

C = TypeVar("C", bound=type)
GUARDED = "__turnstile_store_edge__"  # set on a guarded method: what the tests look for


def _named(exc: Exception, url: str | None) -> StoreUnavailableError | None:
    """The error a caller gets for `exc`: a store error named by the URL; None to let `exc`
    through as it is (not the store's, or naming the store already)."""
    if isinstance(exc, UNAVAILABLE):
        return unreachable(url, exc)
    if not isinstance(exc, StoreUnavailableError) or isinstance(exc, NotDurableError):
        return None  # a write the server took but could not confirm says so in its own words
    where = redact(url or "")
    if where and where in str(exc):
        return None
    # Ours, raised deeper down without the URL (the run store's, the ledger's): the same kind,
    # its message the one a raw error would have had.
    cause = exc.__cause__ if isinstance(exc.__cause__, UNAVAILABLE) else exc
    return type(exc)(unreachable(url, cause).args[0])


def _guarded_iterator(items: Iterator[Any], url: str | None) -> Generator[Any, None, None]:
    try:
        yield from items
    except Exception as exc:
        named = _named(exc, url)
        if named is None:
            raise
        raise named from exc


def _guard(method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def guarded(self: Any, *args: Any, **kwargs: Any) -> Any:
        url = self.config.redis_url
        try:
            result = method(self, *args, **kwargs)
        except Exception as exc:
            named = _named(exc, url)
            if named is None:
                raise
            raise named from exc
        if inspect.isgenerator(result):
            return _guarded_iterator(result, url)
        return result

    setattr(guarded, GUARDED, True)
    return guarded


def guard_store(cls: C) -> C:
    """The class with each of its public methods (its own and its bases') guarded: a store
    that cannot be reached is a StoreUnavailableError naming the URL in `self.config`."""
    names = {name for base in cls.__mro__[:-1] for name in vars(base) if not name.startswith("_")}
    for name in sorted(names):
        member = inspect.getattr_static(cls, name)  # the one the MRO gives, as a plain function
        if inspect.isfunction(member) and not getattr(member, GUARDED, False):
            setattr(cls, name, _guard(member))
    return cls
