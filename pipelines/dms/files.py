"""Files written whole: written beside their name and renamed to it, so that a reader sees the
old file or the new one, never part of one."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

__all__ = ["replace_whole"]


def replace_whole(path: str | os.PathLike[str], write: Callable[[Path], object]) -> Path:
    """``write`` a file beside ``path`` (given its path), then rename it to ``path`` (readable by
    all, as a new file would be): ``path``. Nothing is left beside it if ``write`` raises;
    :class:`OSError` if the file cannot be written."""
    target = Path(path)
    fd, temporary = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    os.close(fd)
    try:
        write(Path(temporary))
        os.chmod(temporary, 0o644)
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    return target
