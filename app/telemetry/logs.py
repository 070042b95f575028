"""structlog set-up: JSON lines in production, key=value on a terminal (STYLE: Logs)."""

from __future__ import annotations

import logging
import sys

import structlog

QUIET_LOGGERS = ("httpx", "httpcore")


def configure_logging(*, json: bool, level: str = "INFO") -> None:
    """Route structlog and the standard library's logging (Celery's, Flower's, alembic's) to
    stderr, both rendered alike: one format for every line a process logs."""
    renderer: structlog.types.Processor = (
        structlog.processors.JSONRenderer()
        if json
        # Plain tracebacks: rich's would print each frame's locals, secrets included.
        else structlog.dev.ConsoleRenderer(
            colors=False, exception_formatter=structlog.dev.plain_traceback
        )
    )
    timestamper = structlog.processors.TimeStamper(fmt="iso", utc=True)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            timestamper,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level)),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[
                structlog.stdlib.add_log_level,
                structlog.stdlib.add_logger_name,
                timestamper,
            ],
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
        )
    )
    # As `basicConfig`: a root logger that has handlers already (a test's) keeps them.
    logging.basicConfig(level=level, handlers=[handler])
    # httpx logs each request's full URL at INFO, query string included: a DingTalk access
    # token, a downstream URL's credentials. Ours log the URLs redacted instead.
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(max(logging.WARNING, logging.getLevelName(level)))


def get_logger(name: str) -> structlog.stdlib.BoundLogger:
    """A logger bound to its module's name."""
    logger: structlog.stdlib.BoundLogger = structlog.get_logger(name)
    return logger
