"""Logging: structlog, JSON in production, human-readable on a terminal.

Context (tenant, run id, step) is bound once per task through context variables, so every
event a step logs, on any thread it starts, carries it.
"""

from __future__ import annotations

import logging
import sys
from typing import Literal

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
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=False,
    )
