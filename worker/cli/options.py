"""The operator commands' options, in one place: each with its flag and its environment
variable, so the names a shell may set are read side by side. The control commands read their
target from `TURNSTILE_CONTROL_QUEUE` / `TURNSTILE_CONTROL_TENANT`, not from the
`TURNSTILE_QUEUE` / `TURNSTILE_TENANT` that submissions use, so a shell set up to submit cannot
pause by accident; the read and decision commands are scoped to `TURNSTILE_TENANT` when it is
set. (--redis-url, --broker-url and --json, which every command takes, are in common.py.)
"""

from __future__ import annotations

import getpass
import socket
from typing import Annotated

import typer


def _operator(by: str) -> str:
    """Who acts, for the record: --by, or the user and host the command runs as."""
    return by or f"{getpass.getuser()}@{socket.gethostname()}"


Operator = Annotated[
    str,
    typer.Option("--by", envvar="TURNSTILE_OPERATOR", callback=_operator,
                 help="Who is deciding, for the record."),
]  # fmt: skip
Tenant = Annotated[
    str | None,
    typer.Option("--tenant", envvar="TURNSTILE_TENANT", show_default=False,
                 help="Only this tenant's runs; another tenant's run is not found."),
]  # fmt: skip
RunId = Annotated[str, typer.Argument(help="The run's id.", show_default=False)]

# pause, resume, drain
ControlQueue = Annotated[
    str | None,
    typer.Option("--queue", envvar="TURNSTILE_CONTROL_QUEUE", show_default=False,
                 help="The queue to act on (every tenant's runs on it)."),
]  # fmt: skip
ControlTenant = Annotated[
    str | None,
    typer.Option("--tenant", envvar="TURNSTILE_CONTROL_TENANT", show_default=False,
                 help="The tenant to act on (its runs on every queue)."),
]  # fmt: skip
DrainQueue = Annotated[
    str,
    typer.Option("--queue", envvar="TURNSTILE_CONTROL_QUEUE", show_default=False,
                 help="The queue to drain."),
]  # fmt: skip
DrainWait = Annotated[
    bool,
    typer.Option("--wait", envvar="TURNSTILE_DRAIN_WAIT",
                 help="Return only when no turn of the queue is in flight."),
]  # fmt: skip
DrainTimeout = Annotated[
    float | None,
    typer.Option("--timeout-s", envvar="TURNSTILE_DRAIN_TIMEOUT_S", min=0, show_default=False,
                 help="With --wait: give up after this many seconds."),
]  # fmt: skip

# approve, deny, cancel
Digest = Annotated[
    str | None,
    typer.Option("--digest", envvar="TURNSTILE_DIGEST", show_default=False,
                 help="Approve only if the held call (or budget hold) has this digest (see "
                      "`status`)."),
]  # fmt: skip
Extend = Annotated[
    list[str] | None,
    typer.Option("--extend", show_default=False, metavar="NAME=LIMIT",
                 help="For a run held needs_budget: a new limit (steps, tool_calls, tokens, "
                      "cost_microusd, deadline_ms), repeatable; none: the suggested one."),
]  # fmt: skip
DenyReason = Annotated[
    str,
    typer.Option("--reason", envvar="TURNSTILE_DENY_REASON", show_default=False,
                 help="Why, for the record (and the model, for a job that shows it)."),
]  # fmt: skip
CancelReason = Annotated[
    str, typer.Option("--reason", envvar="TURNSTILE_CANCEL_REASON", help="For the record.")
]

# runs, watch
StatusFilter = Annotated[
    str | None,
    typer.Option("--status", envvar="TURNSTILE_STATUS", show_default=False,
                 help="running, suspended, parked or stopped."),
]  # fmt: skip
OutcomeFilter = Annotated[
    str | None,
    typer.Option("--outcome", envvar="TURNSTILE_OUTCOME", show_default=False,
                 help="completed, budget_exhausted, cancelled, ... (an unknown one is refused: the"
                      " error names them all)."),
]  # fmt: skip
Limit = Annotated[
    int, typer.Option("--limit", envvar="TURNSTILE_LIMIT", min=1, max=10_000,
                      help="Runs on one page.")
]  # fmt: skip
Cursor = Annotated[
    str | None,
    typer.Option("--cursor", envvar="TURNSTILE_CURSOR", show_default=False,
                 help="Continue a listing: the next_cursor a page gave."),
]  # fmt: skip
WatchLive = Annotated[
    bool,
    typer.Option("--live", envvar="TURNSTILE_WATCH_LIVE",
                 help="Also the run's live output: the answer as the model writes it, tool "
                      "calls starting and ending, their progress notes."),
]  # fmt: skip
WatchTimeout = Annotated[
    float | None,
    typer.Option("--timeout-s", envvar="TURNSTILE_WATCH_TIMEOUT_S", min=0, show_default=False,
                 help="Stop following after this many seconds."),
]  # fmt: skip
