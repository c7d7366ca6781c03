"""Logging: structlog, JSON in production, human-readable on a terminal.

Context (tenant, run id, step) is bound once per task through context variables, so every
event a step logs, on any thread it starts, carries it.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, Literal

import structlog


def configure(fmt: Literal["auto", "json", "console"] = "auto", level: str = "INFO") -> None:
    as_json = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer() if as_json else structlog.dev.ConsoleRenderer()
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        logger_factory=_stderr_logger,
        cache_logger_on_first_use=False,
    )


def _stderr_logger(*args: Any) -> structlog.PrintLogger:
    """A line printer on the process's standard error as it is when the line is written, not
    when logging was configured: a command run in process (a test's CliRunner) swaps it for a
    while, and a line logged after it is put back must not go to the closed stand-in."""
    return structlog.PrintLogger(sys.stderr)
