"""The one exception tree of Turnstile: every error it raises on purpose is a `TurnstileError`.
A denial, a refusal or a budget stop is an outcome, never one of these.

This module imports nothing, so that jobs/ and ledger/ can root their families here without
depending on worker/.
"""


class TurnstileError(Exception):
    """Base of every error Turnstile raises on purpose."""
