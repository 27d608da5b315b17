"""Structured logging through the standard library: structlog's stdlib integration.

Every event goes to the stdlib logger named after its module (``logging.getLogger(name)``), as a
:class:`logging.LogRecord` whose ``msg`` is the event's dict — the event, its fields and the
context bound with :func:`log_context` (frame id, stage, device), which rides along on every event
logged inside the block, in that task and in tasks it starts (they live in contextvars). So the
host decides: until someone configures stdlib logging nothing is written anywhere (the packages'
loggers have a :class:`logging.NullHandler`, so not even Python's last-resort handler speaks), the
stdlib levels filter (``logging.getLogger("pipelines").setLevel(logging.ERROR)``), and a host's
own handler receives every record with its fields (``record.msg``, a dict; as text, one line:
``event key=value ...``). structlog's global configuration is not used: a host's own structlog
setup neither changes these loggers nor is changed by them.

:func:`configure_logging` is for a program of ours (a command, a service): one handler on the root
logger, to standard error, rendering JSON lines (one event per line, machine-readable) or a
readable console format through :class:`structlog.stdlib.ProcessorFormatter` — for the runtime's
events and other libraries' records alike.
"""

from __future__ import annotations

import contextlib
import io
import logging
import sys
from collections.abc import Iterator, MutableMapping
from typing import Any, Literal, TextIO, cast

import structlog
from structlog.stdlib import BoundLogger, ProcessorFormatter
from structlog.typing import EventDict, WrappedLogger

__all__ = ["LogEvent", "configure_logging", "get_logger", "log_context"]

_handler: logging.Handler | None = None
"""The handler :func:`configure_logging` put on the root logger (None: it has not)."""


class LogEvent(dict[str, Any]):
    """An event as a log record carries it (``record.msg``): the event's dict, whose text — what
    a plain :class:`logging.Formatter` writes — is one line, ``event key=value ...``."""

    def __str__(self) -> str:
        fields = " ".join(f"{k}={v!r}" for k, v in self.items() if k not in ("event", "exc_info"))
        return f"{self.get('event', '')} {fields}".rstrip()


_STRUCTLOG_FRAMES = 3
"""Frames between a call such as ``log.info(...)`` and the stdlib logger's method: the bound
logger's method and its two ``_proxy_to_logger`` layers."""


def _to_record(
    logger: WrappedLogger, method: str, event_dict: EventDict
) -> tuple[tuple[LogEvent], dict[str, Any]]:
    """The last processor: the event becomes a stdlib record's ``msg`` (a :class:`LogEvent`),
    marked for :class:`~structlog.stdlib.ProcessorFormatter`; an exception to log is also the
    record's ``exc_info``, so a plain formatter shows its traceback too."""
    (event,), wrapped = ProcessorFormatter.wrap_for_formatter(logger, method, event_dict)
    # The record's place (pathname, lineno, funcName) is the caller's, past structlog's frames.
    kwargs: dict[str, Any] = {**wrapped, "stacklevel": _STRUCTLOG_FRAMES + 1}
    exc_info = event.get("exc_info")
    if exc_info is True:  # the exception being handled, taken now: a handler may format it later
        exc_info = event["exc_info"] = sys.exc_info()[1]
    if exc_info:
        kwargs["exc_info"] = exc_info
    return (LogEvent(event),), kwargs


_PROCESSORS: list[Any] = [
    structlog.stdlib.filter_by_level,  # nothing is built for an event no one would see
    structlog.contextvars.merge_contextvars,  # in the logging task's context, as it logs
    _to_record,
]


class _BoundLogger(BoundLogger):
    def exception(self, event: str | None = None, *args: Any, **kw: Any) -> Any:
        """:meth:`error` with the exception being handled (as structlog's, but the record's place
        is the caller's: one frame fewer in between)."""
        kw.setdefault("exc_info", True)
        return self._proxy_to_logger("error", event, *args, **kw)


def get_logger(name: str) -> BoundLogger:
    """A structlog logger over the stdlib logger ``name`` (a module's ``__name__``): silent
    until stdlib logging is configured (its top-level package's logger gets a
    :class:`logging.NullHandler`), filtered by the stdlib levels."""
    package = logging.getLogger(name.partition(".")[0])
    if not any(isinstance(h, logging.NullHandler) for h in package.handlers):
        package.addHandler(logging.NullHandler())
    return cast(
        BoundLogger,
        structlog.wrap_logger(
            logging.getLogger(name),
            processors=_PROCESSORS,
            wrapper_class=_BoundLogger,
            context_class=dict,
            cache_logger_on_first_use=True,
        ),
    )


def _logger_name(_: WrappedLogger, __: str, event_dict: EventDict) -> EventDict:
    event_dict.setdefault("logger_name", event_dict["_record"].name)
    return event_dict


def _formatter(mode: str) -> ProcessorFormatter:
    processors: list[Any] = [
        _logger_name,
        structlog.stdlib.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    if mode == "json":
        processors += [structlog.processors.format_exc_info]
        renderer: Any = structlog.processors.JSONRenderer()
    elif mode == "console":
        renderer = structlog.dev.ConsoleRenderer(colors=False)
    else:
        raise ValueError(f"mode must be 'json' or 'console', got {mode!r}")
    processors += [ProcessorFormatter.remove_processors_meta, renderer]
    # A record from another library: its extra attributes become fields.
    return ProcessorFormatter(
        processors=processors, foreign_pre_chain=[structlog.stdlib.ExtraAdder()]
    )


def configure_logging(
    mode: Literal["json", "console"] = "console",
    *,
    level: int | str = logging.INFO,
    stream: TextIO | None = None,
    force: bool = False,
) -> bool:
    """Log to ``stream`` from here on, as JSON lines or console lines: one handler on the root
    logger, whose level becomes ``level``. Returns False if it was already configured.

    For a program of ours (a command, a service): a library embedded in an application leaves
    logging to it. Configuration happens once: a second call does not replace the first;
    ``force=True`` does (a service that parsed its options). ``stream``: where lines go
    (default: standard error, as it is when each line is written). Other handlers on the root
    logger (a host's own) are left as they are.
    """
    global _handler
    numeric_level = logging.getLevelName(level.upper()) if isinstance(level, str) else level
    if not isinstance(numeric_level, int):
        raise ValueError(f"unknown log level {level!r}")
    formatter = _formatter(mode)
    if _handler is not None and not force:
        return False
    handler = logging.StreamHandler(stream or cast(TextIO, _CurrentStderr()))
    handler.setFormatter(formatter)
    handler.setLevel(numeric_level)  # also when the root's level is lowered (a test's capture)
    root = logging.getLogger()
    if _handler is not None:
        root.removeHandler(_handler)
    root.addHandler(handler)
    root.setLevel(numeric_level)
    _handler = handler
    return True


class _CurrentStderr(io.TextIOBase):
    """Standard error as it is when each line is written (a program, or a test, that replaces
    ``sys.stderr`` later still gets the lines)."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def event_of(record: logging.LogRecord) -> MutableMapping[str, Any] | None:
    """The event a record of :func:`get_logger`'s loggers carries (a copy), with its
    ``log_level`` and ``logger_name``; None for another library's record."""
    if not isinstance(record.msg, LogEvent):
        return None
    event = dict(record.msg)
    event.setdefault("log_level", record.levelname.lower())
    event.setdefault("logger_name", record.name)
    return event


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
