"""Structured logging: structlog configured once, context bound per task.

Services log JSON lines (one event per line, machine-readable); development logs a readable console
format. Frame id, stage and device are bound with :func:`log_context` and ride along on every event
logged inside the block — in that task and in tasks it starts (they live in contextvars).
"""

from __future__ import annotations

import contextlib
import io
import logging
import sys
from collections.abc import Iterator
from typing import Any, Literal, TextIO, cast

import structlog

__all__ = ["configure_logging", "get_logger", "log_context"]

_configured = False


def configure_logging(
    mode: Literal["json", "console"] = "console",
    *,
    level: int | str = logging.INFO,
    stream: TextIO | None = None,
    force: bool = False,
) -> bool:
    """Configure structlog for the process; returns False if it was already configured.

    Configuration happens once: a library embedding the runtime should not have its logging
    replaced by a second call. ``force=True`` reconfigures (a service that parsed its options).
    ``stream``: where lines go (default: standard error, as it is when each line is written).
    """
    global _configured
    numeric_level = logging.getLevelName(level.upper()) if isinstance(level, str) else level
    if not isinstance(numeric_level, int):
        raise ValueError(f"unknown log level {level!r}")
    processors: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    if mode == "json":
        processors += [structlog.processors.format_exc_info, structlog.processors.JSONRenderer()]
    elif mode == "console":
        processors.append(structlog.dev.ConsoleRenderer(colors=False))
    else:
        raise ValueError(f"mode must be 'json' or 'console', got {mode!r}")
    if _configured and not force:
        return False
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(numeric_level),
        logger_factory=structlog.PrintLoggerFactory(stream or cast(TextIO, _CurrentStderr())),
        cache_logger_on_first_use=False,
    )
    _configured = True
    return True


class _CurrentStderr(io.TextIOBase):
    """Standard error as it is when each line is written (a program, or a test, that replaces
    ``sys.stderr`` later still gets the lines)."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def get_logger(name: str) -> Any:
    """A structlog logger tagged with ``logger_name=name``."""
    return structlog.get_logger(logger_name=name)


@contextlib.contextmanager
def log_context(
    *,
    frame_id: int | None = None,
    stage: str | None = None,
    device: str | None = None,
    **extra: object,
) -> Iterator[None]:
    """Bind context for every event logged inside the block (``None`` values are left out)."""
    values = {"frame_id": frame_id, "stage": stage, "device": device, **extra}
    with structlog.contextvars.bound_contextvars(
        **{k: v for k, v in values.items() if v is not None}
    ):
        yield
