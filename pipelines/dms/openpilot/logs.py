"""openpilot's log files: which names it reads, and their bytes, decompressed as its reader does.

An rlog (or qlog) is Events concatenated (:mod:`.events`), compressed by what its name ends in:
``.zst`` (zstd, one stream, read across frames and into a frame whose blocks were flushed),
``.bz2``, or nothing (a plain log: openpilot's reader accepts only those three spellings). The
content's first bytes decide, as they do for openpilot's reader: a zstd or bz2 magic is
decompressed whatever the name.
"""

from __future__ import annotations

import bz2
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .events import EventError, read_events

__all__ = [
    "BZ2_MAGIC",
    "LOG_NAMES",
    "ZSTD_MAGIC",
    "LogError",
    "compression_of",
    "find_log",
    "read_log",
    "read_log_bytes",
]

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
BZ2_MAGIC = b"BZh"
LOG_NAMES = ("rlog.zst", "rlog.bz2", "rlog")
"""A segment's full log, in the order it is looked for (current segments hold ``rlog.zst``)."""


class LogError(ValueError):
    """A log that cannot be read: missing, unreadable, not compressed as it says, not Events."""


def compression_of(path: str | Path) -> str | None:
    """``"zstd"``, ``"bz2"`` or None (plain) for a log named ``path``; :class:`ValueError` for a
    name openpilot's reader would not take (another extension)."""
    name = Path(path).name
    if name.endswith(".zst"):
        return "zstd"
    if name.endswith(".bz2"):
        return "bz2"
    if Path(name).suffix:
        raise ValueError(
            f"{name}: an openpilot log is named with .zst (zstd), .bz2 or no extension "
            "(plain, e.g. 'rlog')"
        )
    return None


def read_log_bytes(path: str | Path) -> bytes:
    """The Events' bytes of the log at ``path``, decompressed (by its first bytes)."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise LogError(f"{path}: no such log") from None
    except OSError as exc:
        raise LogError(f"{path}: cannot read the log: {exc.strerror}") from None
    if raw.startswith(ZSTD_MAGIC):
        import zstandard

        try:
            # A stream reader reads across frames and returns what an unfinished frame's
            # flushed blocks hold (a log whose writer was killed): one-shot decompress does not.
            return zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True).read()
        except zstandard.ZstdError as exc:
            raise LogError(f"{path}: not a readable zstd stream: {exc}") from None
    if raw.startswith(BZ2_MAGIC):
        try:
            return bz2.decompress(raw)
        except (OSError, EOFError, ValueError) as exc:
            raise LogError(f"{path}: not a complete bz2 stream: {exc}") from None
    return raw


def read_log(path: str | Path) -> Iterator[Any]:
    """The Events of the log at ``path`` that this schema declares (see
    :func:`~.events.read_events`); a log that is not Events: :class:`LogError`."""
    data = read_log_bytes(path)
    try:
        yield from read_events(data)
    except EventError as exc:
        raise LogError(f"{path}: {exc}") from None


def find_log(directory: str | Path) -> Path | None:
    """A segment directory's full log (:data:`LOG_NAMES`, first found), or None."""
    for name in LOG_NAMES:
        candidate = Path(directory) / name
        if candidate.is_file():
            return candidate
    return None
