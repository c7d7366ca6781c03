"""The Lua sources: one library (lib.lua) and one file per operation, composed at registration.

Each registered script is `library_source()` followed by the operation's file, so the
operations share one tested implementation of validation, expiry and settlement, and the
worker's commit script can embed the same settlement (see the top of lib.lua).
"""

from __future__ import annotations

from functools import cache
from importlib import resources

OPERATIONS = (
    "reserve", "settle", "release", "set_ceiling", "read", "reap", "rebuild", "prune",
)  # fmt: skip


@cache
def _source(name: str) -> str:
    return resources.files(__package__ or "").joinpath(f"{name}.lua").read_text(encoding="utf-8")


def library_source() -> str:
    """The Lua library text, to put in front of a script that calls `ledger_settle`."""
    return _source("lib")


def operation_source(operation: str) -> str:
    if operation not in OPERATIONS:
        raise ValueError(f"no ledger operation {operation!r}")
    return _source(operation)


def compose(operation: str) -> str:
    """The full text of one operation's script: the library, then the operation."""
    return library_source() + "\n" + operation_source(operation)
