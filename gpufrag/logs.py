"""structlog set-up shared by every command.

JSON lines when stderr is not a terminal (containers, CI), readable key=value output on a
terminal. Configured once at start-up; the hot paths only call bound loggers.
"""

from __future__ import annotations

import logging
import os
import sys

import structlog

from gpufrag.errors import BadInput

LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
          "error": logging.ERROR, "critical": logging.CRITICAL}


class StderrLogger:
    """Writes each line to whatever ``sys.stderr`` is *now*.

    structlog's PrintLogger keeps the file it was created with; with cached loggers that file
    can be one a test harness (or a daemonising parent) has since closed.
    """

    def msg(self, message: str) -> None:
        stream = sys.stderr
        stream.write(message + "\n")  # one write: lines from threads never interleave
        stream.flush()

    log = debug = info = warn = warning = error = critical = exception = fatal = msg


def _stderr_logger_factory(*_args: object) -> StderrLogger:
    return StderrLogger()


def configure(level: str | None = None, *, json: bool | None = None) -> None:
    """Configure structlog; ``GPUFRAG_LOG_LEVEL`` / ``GPUFRAG_LOG_FORMAT`` override defaults.
    An unknown level is bad input (:class:`BadInput`), never a silent start at info."""
    given = level or os.environ.get("GPUFRAG_LOG_LEVEL") or "info"
    numeric = LEVELS.get(given.lower())
    if numeric is None:
        where = "--log-level" if level else "environment GPUFRAG_LOG_LEVEL"
        raise BadInput(f"unknown log level {given!r}; choose from {', '.join(LEVELS)}",
                       field=where)
    fmt = os.environ.get("GPUFRAG_LOG_FORMAT")
    if json is None:
        json = fmt == "json" if fmt else not sys.stderr.isatty()
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=_stderr_logger_factory,
        cache_logger_on_first_use=True,
    )
