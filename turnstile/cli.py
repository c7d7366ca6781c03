"""The `turnstile` command's entry point (the console script names this module)."""

from __future__ import annotations

from worker.cli import main

__all__ = ["main"]
