"""Recordings written the old way: format version 1, every frame's buffer as it is, as the
recorder wrote them before it compressed frames (the reader still reads them)."""

from __future__ import annotations

import zlib
from collections.abc import Iterable
from pathlib import Path

from pipelines.dms.frames.frame import Frame
from pipelines.dms.frames.recording import FILE_HEADER, FILE_MAGIC, RECORD_HEADER_V1, RECORD_MARKER


def write_v1(path: Path, frames: Iterable[Frame]) -> list[int]:
    """A version 1 recording of ``frames``; returns each record's byte offset."""
    offsets = []
    with path.open("wb") as file:
        file.write(FILE_HEADER.pack(FILE_MAGIC, 1, 0))
        for frame in frames:
            offsets.append(file.tell())
            data = frame.buffer.data
            file.write(
                RECORD_HEADER_V1.pack(
                    RECORD_MARKER, frame.width, frame.height, frame.stride, frame.frame_id,
                    frame.timestamp_sof, frame.timestamp_eof, frame.buffer.size,
                    zlib.crc32(data), 0,
                )
            )  # fmt: skip
            file.write(data)
    return offsets
