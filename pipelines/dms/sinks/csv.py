"""The CSV sink: one row per frame's message, the Parquet sink's columns as text, to a new file.

For a spreadsheet, or a reader with no Parquet library: the first line names the columns
(:data:`~.parquet.PARQUET_COLUMNS`, ``recording`` the camera's name: its file's, or
``synthetic``), each line after it one message's values (:func:`~.parquet.message_row`): a null is
an empty field, a flag ``True`` or ``False``, a number as Python writes it (a float32 driver value
exactly). As the Parquet sink, it takes no status message of a stalled camera (``frameId`` -1): one
row per frame.

Rows are made and written by the sink's own thread (:class:`~.file.FileSink`), never blocking the
event loop. Policy (see :mod:`.base`), as the JSON lines sink's: live, at most ``backlog`` rows wait
(latest wins past that, the dropped ones counted); replaying, nothing is dropped. A write that fails
(a full disk) fails the sink (:class:`~.base.SinkFailed`). The file must be new: one that exists,
or a path that cannot be created, is a :class:`ValueError` in one line, at construction.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ..config.kinds import Mode
from ..messages import DriverStateV2
from .base import LIVE_BACKLOG, check_backlog
from .file import FileSink, open_for_writing
from .parquet import PARQUET_COLUMNS, message_row

if TYPE_CHECKING:
    from ..config.settings import ServiceConfig
    from . import Rows

__all__ = ["CsvSink", "open_sinks"]


class _CsvStream:
    """Messages as CSV rows, the header before the first."""

    held = 0

    def __init__(self, recording: str) -> None:
        self._recording = recording
        self._header = _line(PARQUET_COLUMNS)

    def encode(self, records: Sequence[DriverStateV2]) -> bytes:
        header, self._header = self._header, b""
        rows = (_line(message_row(message, self._recording)) for message in records)
        return header + b"".join(rows)

    def end(self) -> bytes:
        return self._header  # a run with no row still names its columns


class CsvSink(FileSink[DriverStateV2]):
    """One CSV row per frame's message to ``path``, a new file; see the module's description."""

    def __init__(
        self,
        path: str | Path,
        *,
        recording: str = "",
        delivery: Mode = Mode.LIVE,
        backlog: int = LIVE_BACKLOG,
    ) -> None:
        check_backlog(backlog)
        name = f"csv {path}"
        fd = open_for_writing(Path(path), name, new=True)
        encoder = _CsvStream(recording)
        super().__init__(fd, name=name, encoder=encoder, delivery=delivery, backlog=backlog)

    def publish(self, message: DriverStateV2) -> None:
        if message.frame_id >= 0:  # a stalled camera's status is no frame's row
            super().publish(message)

    def _record(self, message: DriverStateV2) -> DriverStateV2:
        return message  # made a row on the writer's thread


def _line(values: Sequence[object]) -> bytes:
    text = io.StringIO()
    csv.writer(text, lineterminator="\n").writerow(values)
    return text.getvalue().encode()


def open_sinks(config: ServiceConfig, rows: Rows) -> list[CsvSink]:
    """The sink ``--csv`` asks for, open."""
    assert config.csv is not None
    return [CsvSink(config.csv, recording=rows.recording, delivery=config.mode)]
