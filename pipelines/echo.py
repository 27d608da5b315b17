"""How an error message echoes what it refuses: cut to a short prefix, so that a 100 kB value
given to an option is not written back whole in its one line."""

from __future__ import annotations

import os
import re
from typing import Any

__all__ = ["ECHO_LIMIT", "PATH_ECHO_LIMIT", "cut_words", "shown", "shown_path"]

ECHO_LIMIT = 60
"""Characters of a refused value that an error message echoes."""
PATH_ECHO_LIMIT = 255
"""Characters of a path that an error message echoes: a path is of use whole, and 255 is the
longest file name Linux takes."""

_LONG_WORD = re.compile(rf"\S{{{ECHO_LIMIT + 1},}}")


def shown(value: Any, limit: int = ECHO_LIMIT) -> str:
    """``value`` as an error message echoes it: its ``repr``, cut to its first ``limit``
    characters, then ``…`` and its length, where it is longer."""
    text = repr(value)
    if len(text) <= limit:
        return text
    length = len(value) if isinstance(value, (str, bytes)) else len(text)
    return f"{text[:limit]}… ({length} characters)"


def shown_path(path: str | os.PathLike[str]) -> str:
    """A path as an error message echoes it: :func:`shown` with :data:`PATH_ECHO_LIMIT`."""
    return shown(os.fspath(path), PATH_ECHO_LIMIT)


def cut_words(message: str) -> str:
    """``message`` (made by another library, echoing what it refuses as it likes) with each
    word longer than :data:`ECHO_LIMIT` cut as :func:`shown` cuts a value (a quoted word's
    length is its value's)."""

    def cut(word: re.Match[str]) -> str:
        text = word[0]
        quoted = text[0] in "'\"" and text[-1] == text[0]
        return f"{text[:ECHO_LIMIT]}… ({len(text) - 2 * quoted} characters)"

    return _LONG_WORD.sub(cut, message)
