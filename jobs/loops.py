"""Loop detectors over canonical call signatures: pure functions, no I/O.

A signature is the tool name and its canonical arguments. Call ids and result text are left
out on purpose: both are fresh every time, and with them in, identical intent never repeats.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import msgspec

NO_CALL = "-"  # the signature of a turn that proposed no call: it breaks an oscillation


def call_signature(name: str, args: Any) -> str:
    canonical = msgspec.json.encode([name, args], order="sorted")
    return hashlib.sha256(canonical).hexdigest()[:16]


def turn_signature(call_signatures: Sequence[str]) -> str:
    if not call_signatures:
        return NO_CALL
    if len(call_signatures) == 1:
        return call_signatures[0]
    return hashlib.sha256(",".join(call_signatures).encode()).hexdigest()[:16]


def repeated(seen: dict[str, int], *, max_repeat: int) -> str | None:
    """The first signature proposed more than max_repeat times, or None."""
    return next((sig for sig, n in seen.items() if n > max_repeat), None)


def oscillating(recent: Sequence[str], *, window: int) -> bool:
    """True when the last `window` turns alternate between two different calls: A B A B."""
    if window < 2 or len(recent) < window:
        return False
    tail = recent[-window:]
    a, b = tail[0], tail[1]
    if a == b or NO_CALL in (a, b):
        return False
    return all(sig == (a if i % 2 == 0 else b) for i, sig in enumerate(tail))


def stalled(stalls: int, *, max_stalls: int) -> bool:
    return stalls >= max_stalls
