"""The ledger's exception tree. A rejected reservation is a result, never one of these."""

from __future__ import annotations

from turnstile.errors import StoreUnavailableError, TurnstileError


class LedgerError(TurnstileError):
    """Base of every error the ledger raises on purpose."""


class LedgerInputError(LedgerError, ValueError):
    """Bad input, found before anything was sent to the server."""


class LedgerUnavailable(LedgerError, StoreUnavailableError):  # noqa: N818 - named in the worker's contract
    """The server could not be reached or did not answer in time.

    The call may or may not have been applied; retrying it with the same id is safe.
    """


class LedgerConflict(LedgerError):  # noqa: N818 - named in the worker's contract
    """The id was used before with different amounts, actuals or settings; nothing changed."""


class LedgerUnknownReservation(LedgerError):  # noqa: N818 - named in the worker's contract
    """No such reservation: never admitted, or forgotten after the retention period."""


class LedgerProtocolError(LedgerError):
    """The server answered something this library does not understand (a bug, or a mismatch)."""
