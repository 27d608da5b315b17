"""The JSON lines sink: one record per line, to a file, a pipe or FIFO, or standard output.

Lines are written by a thread of the sink's own (:class:`~.file.FileSink`), so a slow disk
or a stalled reader never blocks the event loop. Each line is delivered once written whole
(``os.write`` of at most ``PIPE_BUF`` bytes at a time, after ``poll`` says there is room: a line
of up to 4 KiB reaches a pipe at once or not at all). Policy (see :mod:`.base`):

- live: at most ``backlog`` lines wait (default 200, 10 s at 20 Hz); past that the oldest is
  dropped (latest wins), counted and logged (when dropping starts and when it stops);
- replay: nothing is dropped; ``await sink.room()`` returns once fewer than ``backlog`` wait.

A write that fails — a full disk (``/dev/full``), a pipe whose reader went away, a closed file —
ends the sink: :meth:`JsonLinesSink.failure` is a :class:`~.base.SinkFailed`, logged once,
and :meth:`JsonLinesSink.wait_failure` returns it at once; what was held, and everything published
after, is dropped (counted). Standard output closed by its reader (``| head``) is a
:class:`~.base.ReaderClosed` instead: an end, not a failure. A regular file that exists
is refused unless ``append=True`` (then appended to): the lines of one run are never mixed into
another's by accident. A path that cannot be opened for writing (a missing directory, a directory,
no permission, a FIFO that no one reads, a file that exists) is a :class:`ValueError` at
construction, in one line; FIFOs and devices are written to as they are.

:meth:`JsonLinesSink.close` lets the thread write what is held for at most ``timeout`` seconds and
counts the rest as dropped; one exception to exactness: a write the kernel itself holds (a
terminal stopped with XOFF, a hung network file system) cannot be interrupted: that line is
counted dropped although it may still appear.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ..config.kinds import Mode
from ..messages import DriverStateV2
from .base import LIVE_BACKLOG, check_backlog
from .file import FileSink, PlainStream, open_for_writing

if TYPE_CHECKING:
    from ..config.settings import ServiceConfig
    from . import Rows

__all__ = ["JsonLinesSink", "open_sinks"]


class JsonLinesSink(FileSink[bytes]):
    """One JSON record per line to ``path`` (``"-"``: standard output); see the module's
    description for the policy, failures and closing."""

    def __init__(
        self,
        path: str | Path,
        *,
        delivery: Mode = Mode.LIVE,
        backlog: int = LIVE_BACKLOG,
        name: str | None = None,
        append: bool = False,
    ) -> None:
        check_backlog(backlog)
        stdout = str(path) == "-"
        name = name or f"jsonl {path}"
        fd = _open_stdout(name) if stdout else open_for_writing(Path(path), name, append=append)
        super().__init__(
            fd, name=name, encoder=PlainStream(), delivery=delivery, backlog=backlog, stdout=stdout
        )

    def _record(self, message: DriverStateV2) -> bytes:
        return (message.to_json() + "\n").encode()


def _open_stdout(name: str) -> int:
    """A descriptor of our own for standard output (closing it leaves standard output open)."""
    try:
        fd = sys.stdout.fileno()
        sys.stdout.flush()  # what was printed before comes first
        return os.dup(fd)
    except (AttributeError, OSError, ValueError):
        raise ValueError(f"{name}: standard output is not an open file") from None


def open_sinks(config: ServiceConfig, rows: Rows) -> list[JsonLinesSink]:
    """The sink ``--jsonl`` asks for (``--append``: to a file that exists), open."""
    assert config.jsonl is not None
    return [JsonLinesSink(config.jsonl, delivery=config.mode, append=config.jsonl_append)]
