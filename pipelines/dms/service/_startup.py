"""How the service starts, and how it says it could not: one typed error, :class:`StartupError`.

Everything the service needs before it takes its first frame is checked or opened first — the
machine's side of the config, the sinks, the health endpoints' port, the model and its contract —
and a failure of any of them is one :class:`StartupError` out of ``async with DmsService(...)``
(never an exception group), naming the setting that changes it.
"""

from __future__ import annotations

__all__ = ["StartupError", "describe", "startup_error"]


class StartupError(Exception):
    """The service could not start. ``setting``: the :class:`~pipelines.dms.config.ServiceConfig`
    field that changes it (None: no one setting does). The error behind it is its
    ``__cause__``."""

    def __init__(self, message: str, *, setting: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.setting = setting


def describe(error: BaseException) -> str:
    """One line for ``error``: the first error inside an exception group, by its message (and its
    type, where the message alone would not say what it is)."""
    if isinstance(error, BaseExceptionGroup) and error.exceptions:
        return describe(error.exceptions[0])
    text = str(error).splitlines()[0] if str(error) else ""
    if isinstance(error, (OSError, ValueError, TimeoutError)) and text:
        return text
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def startup_error(error: BaseException) -> StartupError | None:
    """The :class:`StartupError` ``error`` is, or holds inside its exception groups."""
    if isinstance(error, StartupError):
        return error
    if isinstance(error, BaseExceptionGroup):
        for inner in error.exceptions:
            found = startup_error(inner)
            if found is not None:
                return found
    return None
