"""Dimensions, periods and the checks every input passes before any I/O."""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from enum import StrEnum

from turnstile.ledger.errors import LedgerInputError

MAX_AMOUNT = 2**53
"""Largest amount, ceiling or total: Lua numbers are doubles, exact up to 2^53."""

MAX_ID_CHARS = 256
# The worker's limit for every name too; its tenants (worker/names.py: letters, digits and
# '.', '_', ':', '@', '-') are a subset of those checked here, so it never hands over one refused.
MAX_TENANT_CHARS = 128
MAX_TIMEOUT_S = 30 * 24 * 3600  # a month: anything longer is a mistake in units, not a step

DEFAULT_DIMENSIONS = ("steps", "tool_calls", "tokens", "cost_microusd")
"""The built-in dimensions, in the order rejections are reported: the worker names the first
one that does not fit. Other dimensions come after these, alphabetically."""

_DIMENSION = re.compile(r"[a-z][a-z0-9_]{0,63}")
_TENANT_FORBIDDEN = re.compile(r"[{}\s\x00-\x1f\x7f]")
_ID_FORBIDDEN = re.compile(r"[\s\x00-\x1f\x7f]")


class Period(StrEnum):
    """How often a dimension's usage starts again from zero (UTC, by the server's clock)."""

    NONE = "none"
    DAY = "day"
    MONTH = "month"


def dimension_rank(name: str) -> tuple[int, str]:
    """Sort key: the built-in dimensions in their fixed order, then the rest alphabetically."""
    if name in DEFAULT_DIMENSIONS:
        return DEFAULT_DIMENSIONS.index(name), ""
    return len(DEFAULT_DIMENSIONS), name


def in_dimension_order(names: Iterable[str]) -> list[str]:
    return sorted(names, key=dimension_rank)


@functools.lru_cache(maxsize=256)
def _ordered(names: tuple[str, ...]) -> tuple[str, ...]:
    """`in_dimension_order` of a mapping's names, once per set of names in one order (every
    reserve and settle of a worker names the same few)."""
    return tuple(in_dimension_order(names))


def check_dimension_name(name: object) -> str:
    if not isinstance(name, str) or not _DIMENSION.fullmatch(name):
        raise LedgerInputError(
            f"bad dimension name {name!r}: lower-case letters, digits and _, at most 64"
        )
    return name


def check_tenant(tenant: object) -> str:
    if not isinstance(tenant, str) or not tenant:
        raise LedgerInputError("tenant must be a non-empty string")
    if len(tenant) > MAX_TENANT_CHARS or _TENANT_FORBIDDEN.search(tenant):
        raise LedgerInputError(
            f"bad tenant {tenant!r}: at most {MAX_TENANT_CHARS} characters, "
            "no braces, spaces or control characters"
        )
    if tenant.startswith("-"):  # a command line would read it as an option: never named again
        raise LedgerInputError(f"bad tenant {tenant!r}: a name may not start with '-'")
    return tenant


def check_id(value: object, what: str = "reservation id") -> str:
    if not isinstance(value, str) or not value:
        raise LedgerInputError(f"{what} must be a non-empty string")
    if len(value) > MAX_ID_CHARS or _ID_FORBIDDEN.search(value):
        raise LedgerInputError(
            f"bad {what} {value!r}: at most {MAX_ID_CHARS} characters, no spaces or control "
            "characters"
        )
    return value


def check_amount(name: str, value: object) -> int:
    # bool is an int in Python; True tokens is a bug in the caller, not a 1.
    if not isinstance(value, int) or isinstance(value, bool):
        raise LedgerInputError(f"{name} must be an integer, got {value!r}")
    if value < 0 or value > MAX_AMOUNT:
        raise LedgerInputError(f"{name} must be in 0..2^53, got {value}")
    return value


def check_amounts(
    amounts: object, known: Sequence[str], *, allow_empty: bool
) -> list[tuple[str, int]]:
    """Validated (dimension, amount) pairs in dimension order."""
    if not isinstance(amounts, Mapping):
        raise LedgerInputError(f"amounts must map dimension names to integers, got {amounts!r}")
    if not amounts and not allow_empty:
        raise LedgerInputError("nothing to reserve: name at least one dimension")
    for name, value in amounts.items():
        if name not in known:  # the known names were checked once, when the ledger was made
            check_known_dimension(name, known)
        if type(value) is not int or not 0 <= value <= MAX_AMOUNT:  # else surely fine
            check_amount(name, value)
    return [(name, amounts[name]) for name in _ordered(tuple(amounts))]


def check_known_dimension(name: object, known: Sequence[str]) -> str:
    checked = check_dimension_name(name)
    if checked not in known:
        raise LedgerInputError(
            f"unknown dimension {checked!r}: known are {', '.join(in_dimension_order(known))}"
        )
    return checked


def check_period(period: object) -> Period:
    if isinstance(period, str) and period in Period.__members__.values():
        return Period(period)
    raise LedgerInputError(f"period must be none, day or month, got {period!r}")


def seconds_to_ms(name: str, seconds: object, *, maximum_s: float = MAX_TIMEOUT_S) -> int:
    """Whole milliseconds, rounded up so that a deadline is never earlier than asked."""
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        raise LedgerInputError(f"{name} must be a number of seconds, got {seconds!r}")
    if not math.isfinite(seconds) or seconds < 0 or seconds > maximum_s:
        raise LedgerInputError(f"{name} must be between 0 and {maximum_s} seconds, got {seconds}")
    # Round away float noise first (1.1 s is 1100.0000000000002 ms), then up.
    return math.ceil(round(seconds * 1000, 6))


def flat_pairs(pairs: Iterable[tuple[str, int]]) -> list[str]:
    """ARGV form: dimension, amount, dimension, amount, ..."""
    out: list[str] = []
    for name, amount in pairs:
        out += (name, str(amount))
    return out
