"""The one exception tree of Turnstile. A denial or a refusal is an outcome, never one of these."""


class TurnstileError(Exception):
    """Base of every error Turnstile raises on purpose."""
