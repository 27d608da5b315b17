"""The text forms of the settings' values: what a user typed, turned into a value, or
:class:`Unexpected` (a :class:`ValueError`) saying what was expected and echoing what was given
(through :func:`~pipelines.echo.shown`: cut to a short prefix).

Numbers are read in ASCII only: a whole number is ASCII digits with an optional sign
(:func:`integer`), a number a decimal one in ASCII digits, with an optional fraction and exponent
(:func:`number`). No spaces around them, no ``_`` between digits (``1_000``), no digits of other
scripts (``٤٠``), no ``nan`` or ``inf`` — all of which Python's ``int()`` and ``float()`` take.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, TypeVar

import numpy as np

from ...echo import ECHO_LIMIT, PATH_ECHO_LIMIT, shown
from ..openpilot.logs import compression_of

E = TypeVar("E", bound=enum.StrEnum)

__all__ = [
    "Calibration",
    "ModelCpus",
    "Unexpected",
    "calibration",
    "check_calibration",
    "choice",
    "integer",
    "log_path",
    "model_cpus",
    "new_file_path",
    "number",
    "one_of",
    "port",
]


class Unexpected(ValueError):
    """A text form's refusal: what it ``expected``, and the text (or the part of it) it ``got``,
    echoed through :func:`shown`."""

    def __init__(self, expected: str, got: Any, limit: int = ECHO_LIMIT) -> None:
        super().__init__(f"{expected}, got {shown(got, limit)}")
        self.expected = expected
        self.got = got


_WHOLE = re.compile(r"[-+]?[0-9]+")
_DECIMAL = re.compile(r"[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?")
_WHOLE_DIGITS = 4300
"""Python reads no longer whole number from text (``sys.get_int_max_str_digits``' default)."""

Calibration = tuple[float, float, float]
"""(roll, pitch, yaw), radians."""


def check_calibration(values: Any) -> Calibration:
    """Three finite numbers (roll, pitch, yaw), or :class:`ValueError` saying so."""
    try:
        flat = np.asarray(values, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError):
        flat = np.zeros(0)
    if flat.size != 3 or not np.isfinite(flat).all():
        raise ValueError(
            f"calibration must be 3 finite numbers (roll, pitch, yaw), got {shown(values)}"
        )
    return float(flat[0]), float(flat[1]), float(flat[2])


def calibration(text: str) -> Calibration:
    """``R,P,Y``: three numbers (:func:`number`'s form), radians."""
    parts = text.split(",")
    if len(parts) != 3 or not all(_DECIMAL.fullmatch(part) for part in parts):
        raise Unexpected("expected R,P,Y (three numbers)", text)
    return check_calibration([float(part) for part in parts])


ModelCpus = tuple[int, ...] | Literal["auto"] | None


def model_cpus(text: str) -> ModelCpus:
    """``auto``, ``none`` or CPU numbers, comma-separated (ASCII digits)."""
    if text in ("auto", "none"):
        return None if text == "none" else "auto"
    cpus = text.split(",")
    if not all(cpu.isascii() and cpu.isdigit() and len(cpu) < _WHOLE_DIGITS for cpu in cpus):
        raise Unexpected("expected auto, none or CPU numbers", text)
    return tuple(int(cpu) for cpu in cpus)


def choice(kind: type[E]) -> Callable[[str], E]:
    """The text form of an enum of strings: one of its values."""

    def parse(text: str) -> E:
        try:
            return kind(text)
        except ValueError:
            raise Unexpected(one_of(kind), text) from None

    return parse


def one_of(kind: type[enum.Enum]) -> str:
    """What a value of ``kind`` must be: one of its values."""
    return "must be " + " or ".join(repr(item.value) for item in kind)


def integer(text: str) -> int:
    """A whole number: ASCII digits, an optional sign (see the module's description)."""
    if not _WHOLE.fullmatch(text):
        raise Unexpected("expected a whole number (ASCII digits)", text)
    if len(text) > _WHOLE_DIGITS:
        raise Unexpected(f"expected a whole number of at most {_WHOLE_DIGITS} digits", text)
    return int(text)


def number(text: str) -> float:
    """A decimal number in ASCII digits: ``0.05``, ``-1``, ``5e-2`` (see the module's
    description); one too large for a float is ``inf``, which the settings' checks refuse."""
    if not _DECIMAL.fullmatch(text):
        raise Unexpected("expected a number (ASCII digits, e.g. 0.05 or 5e-2)", text)
    return float(text)


def port(text: str) -> int | None:
    port = integer(text)
    return None if port == -1 else port  # the command line's "none"


def new_file_path(text: str, what: str = "file") -> Path:
    """The text form of a new file's path (standard output is not one)."""
    if not text or text == "-":
        raise Unexpected(f"expected the path of a new {what}", text, PATH_ECHO_LIMIT)
    return Path(text)


def log_path(text: str) -> Path:
    """The text form of an openpilot log's path: a new file's, named as openpilot's reader takes
    a log."""
    try:
        compression_of(new_file_path(text, "log file"))
    except Unexpected:
        raise
    except ValueError:
        raise Unexpected(
            "expected a log named with .zst (zstd), .bz2 or no extension (plain, e.g. 'rlog')",
            text,
            PATH_ECHO_LIMIT,
        ) from None
    return Path(text)
