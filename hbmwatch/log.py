"""Structured logging (structlog) for every command; secrets never reach it.

structlog's events and the standard library's records (uvicorn, SQLAlchemy, psycopg, httpx)
go through one handler on the root logger, so both are rate-limited, scrubbed of secrets
(hbmwatch.logfilters) and rendered alike.  Tracebacks are plain text without frame locals:
the console renderer's default (rich, ``show_locals``) printed the database password that
sat in SQLAlchemy's connect arguments.  JSON lines keep the traceback as a string.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, TextIO

import structlog
from structlog.stdlib import ProcessorFormatter

from hbmwatch.logfilters import (
    RateLimiter,
    register_secret,
    register_secrets,
    scrub_event,
    scrub_rendered,
)

__all__ = ["configure", "get", "register_secret", "register_secrets"]
#: Libraries that log every request or migration step at info.
NOISY = ("httpx", "httpcore", "alembic", "uvicorn.access")


def configure(
    level: str = "info",
    fmt: str = "console",
    *,
    repeat_seconds: float = 10.0,
    stream: TextIO | None = None,
) -> None:
    """Log to stderr (or ``stream``) at ``level``, as ``console`` text or ``json`` lines.

    The same warning or error within ``repeat_seconds`` is written once; 0 writes all.
    """
    out = stream if stream is not None else sys.stderr
    threshold = logging.getLevelName(level.upper())
    limiter = RateLimiter(repeat_seconds)
    head: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_logger_name,
        structlog.stdlib.add_log_level,
    ]
    stamp = structlog.processors.TimeStamper(fmt="iso", utc=True)
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(
            colors=out.isatty(), exception_formatter=structlog.dev.plain_traceback
        )
    )
    formatter = ProcessorFormatter(
        # other libraries' records were rate-limited by the handler's filter (below)
        foreign_pre_chain=[*head, stamp, structlog.stdlib.ExtraAdder(allow=("repeated",))],
        processors=[
            ProcessorFormatter.remove_processors_meta,
            structlog.processors.format_exc_info,  # the traceback as text, never its locals
            scrub_event,
            renderer,
            scrub_rendered,
        ],
    )
    handler = logging.StreamHandler(out)
    handler.setFormatter(formatter)
    handler.addFilter(limiter)
    root = logging.getLogger()
    for old in root.handlers[:]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(threshold)
    for noisy in NOISY:
        logging.getLogger(noisy).setLevel(max(logging.WARNING, threshold))
    structlog.configure(
        processors=[*head, limiter, stamp, ProcessorFormatter.wrap_for_formatter],
        wrapper_class=structlog.make_filtering_bound_logger(threshold),
        logger_factory=structlog.stdlib.LoggerFactory(),
        cache_logger_on_first_use=False,
    )


def get(name: str) -> structlog.stdlib.BoundLogger:
    if not structlog.is_configured():
        _safe_defaults()
    return structlog.get_logger(name)


def _safe_defaults() -> None:
    """Before ``configure`` (an embedding app, a test): structlog's own defaults render
    rich tracebacks with frame locals, which is how secrets leak; these never do."""
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            scrub_event,
            structlog.dev.ConsoleRenderer(colors=False),
            scrub_rendered,
        ],
    )
