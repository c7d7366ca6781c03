"""A run's priority: a whole number from 0 to 9, higher served first within its tenant's fair
share, 5 when none is given. It is stored on the run (its hash's `priority`, written once by
run_create.lua) and every later step of the run keeps it: the Lua that queues a step reads it
there (fair_lib.lua). How a tenant's pending steps are ordered by it, and how a waiting step's
effective priority rises with its wait (TURNSTILE_PRIORITY_AGING_S), is in fair_lib.lua; the
broker's own priority, which orders steps only with fair share off, in broker/message.py.
"""

from __future__ import annotations

from turnstile.errors import SubmissionError

LOWEST = 0
HIGHEST = 9
DEFAULT = 5  # fair_lib.lua's FAIR_DEFAULT_PRIORITY: a run stored without one counts as this


class PriorityError(SubmissionError):
    """A priority that is not a whole number from 0 to 9 (a bool, a float, text, 10)."""


def check_priority(value: object) -> int:
    """`value` as a priority, or PriorityError in one line. Only an int is one: True is not 1
    and 5.0 is not 5, as over HTTP."""
    if type(value) is not int or not LOWEST <= value <= HIGHEST:
        raise PriorityError(
            f"priority must be a whole number from {LOWEST} to {HIGHEST}, not {value!r:.40}"
        )
    return value


def stored_priority(raw: object) -> int:
    """A run hash's `priority` field as a number (a run stored before priorities: DEFAULT)."""
    try:
        return check_priority(int(str(raw)))
    except (ValueError, PriorityError):
        return DEFAULT
