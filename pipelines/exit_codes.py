"""The exit codes of every ``aio-dms`` command, defined once (the table in docs/commands.md is this one)."""

from __future__ import annotations

import enum

__all__ = ["ExitCode", "stopped_exit_code"]


class ExitCode(enum.IntEnum):
    OK = 0
    """Success — including a ``run`` stopped by a signal (or its standard output closed by the
    reader), whatever it had published by then."""
    FAILED = 1
    """A run that ended by itself and failed: the camera failed, a file sink failed, not one
    frame was valid, or its summary document could not be written; a ``record`` that failed (its
    camera, or writing its file); ``model-info`` of a model that fails its check."""
    REFUSED = 2
    """Usage, config or environment refused before work started (one line on standard error)."""
    DIFFERS = 3
    """Compared, and differs beyond tolerance."""
    SOME_FAILED = 4
    """Some inputs of a batch failed."""
    INTERRUPTED = 130
    """A ``replay``, a ``record`` (or a batch) interrupted before it completed; and any second
    signal."""


def stopped_exit_code(command: str | None) -> ExitCode:
    """The exit code of ``command`` stopped before it ended by itself (a signal, or a run's
    standard output closed by its reader): :attr:`ExitCode.OK` for a ``run``, whatever it had
    published by then; :attr:`ExitCode.INTERRUPTED` for any other command (a replay, a demo)."""
    return ExitCode.OK if command == "run" else ExitCode.INTERRUPTED
