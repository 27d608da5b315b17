"""Reading a recording (:mod:`pipelines.dms.frames.recording` describes the format): version 2, each
frame stored as it is or compressed with zstd, and version 1, uncompressed.

Opening a recording checks the file header and walks every record header (not the data), so a
truncated file, a bad marker, a geometry that is not camerad's, an unknown codec or time going
back is reported at once as :class:`~pipelines.dms.frames.recording.ReplayFormatError`, naming the record
and its byte offset; a record's data is decoded and checked against its CRC when it is read.
"""

from __future__ import annotations

import io
import os
import threading
import zlib
from pathlib import Path

import numpy as np
import zstandard

from .frame import Frame, FrameError, nv12_layout
from .recording import (
    CODEC_RAW,
    CODEC_ZSTD,
    FILE_HEADER,
    FILE_MAGIC,
    RECORD_HEADER,
    RECORD_HEADER_V1,
    RECORD_MARKER,
    Closing,
    RecordHeader,
    ReplayFormatError,
)

__all__ = ["READ_VERSIONS", "RecordingReader"]

READ_VERSIONS = (1, 2)
"""The format versions this reader reads."""


class RecordingReader(Closing):
    """Reads a recording (blocking file I/O). Opening it validates the file header and every
    record header; :meth:`read` returns a record's frame, stamped with its recorded timestamps."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._file: io.BufferedReader = self.path.open("rb")
        self._lock = threading.Lock()  # a read and close() never overlap
        self.version = 0
        """The file's format version."""
        try:
            self.records: list[RecordHeader] = self._index()
        except BaseException:
            self._file.close()
            raise

    def _fail(self, offset: int, record: int | None, problem: str) -> ReplayFormatError:
        return ReplayFormatError(self.path, offset, record, problem)

    def _index(self) -> list[RecordHeader]:
        file = self._file
        end = os.fstat(file.fileno()).st_size
        raw = file.read(FILE_HEADER.size)
        if len(raw) < FILE_HEADER.size:
            raise self._fail(0, None, f"truncated: {len(raw)} of {FILE_HEADER.size} bytes")
        magic, version, _ = FILE_HEADER.unpack(raw)
        if magic != FILE_MAGIC:
            raise self._fail(
                0, None, f"not a frame recording: magic {magic!r}, expected {FILE_MAGIC!r}"
            )
        if version not in READ_VERSIONS:
            raise self._fail(
                0, None, f"format version {version}, this reader reads versions 1 and 2"
            )
        self.version = version
        records: list[RecordHeader] = []
        offset = FILE_HEADER.size
        while offset < end:
            record = self._record_header(
                offset, len(records), end, records[-1] if records else None
            )
            records.append(record)
            offset = record.data_offset + record.stored
        return records

    def _record_header(
        self, offset: int, index: int, end: int, previous: RecordHeader | None
    ) -> RecordHeader:
        shape = RECORD_HEADER if self.version == 2 else RECORD_HEADER_V1
        self._file.seek(offset)
        raw = self._file.read(shape.size)
        if len(raw) < shape.size:
            raise self._fail(offset, index, f"truncated header: {len(raw)} of {shape.size} bytes")
        if self.version == 2:
            marker, width, height, stride, frame_id, sof, eof, size, stored, crc, codec = (
                shape.unpack(raw)
            )
        else:
            marker, width, height, stride, frame_id, sof, eof, size, crc, _ = shape.unpack(raw)
            stored, codec = size, CODEC_RAW
        if marker != RECORD_MARKER:
            raise self._fail(
                offset, index, f"bad record marker {marker!r}, expected {RECORD_MARKER!r}"
            )
        try:
            layout = nv12_layout(width, height)
        except FrameError as exc:
            raise self._fail(offset, index, f"bad geometry: {exc}") from None
        if (stride, size) != (layout.stride, layout.size):
            raise self._fail(
                offset,
                index,
                f"geometry {width}x{height} with stride {stride} and {size} bytes; expected "
                f"stride {layout.stride} and {layout.size} bytes",
            )
        if codec not in (CODEC_RAW, CODEC_ZSTD):
            raise self._fail(offset, index, f"unknown codec {codec} (0: none, 1: zstd)")
        if codec == CODEC_RAW and stored != size:
            raise self._fail(
                offset, index, f"{stored} bytes stored for a frame of {size} stored as it is"
            )
        if eof < sof:
            raise self._fail(offset, index, f"end of frame {eof} ns is before its start {sof} ns")
        if previous is not None and sof < previous.sof:
            raise self._fail(
                offset,
                index,
                f"start of frame {sof} ns goes back from the previous record's {previous.sof} ns",
            )
        data_offset = offset + shape.size
        if data_offset + stored > end:
            raise self._fail(
                offset,
                index,
                f"truncated data: the header announces {stored} bytes of frame data, "
                f"the file holds {end - data_offset}",
            )
        return RecordHeader(
            width, height, stride, frame_id, sof, eof, size, crc, data_offset, stored, codec, offset
        )

    def __len__(self) -> int:
        return len(self.records)

    def read(self, index: int) -> Frame:
        """Frame ``index``, with ``timestamp_sof`` / ``timestamp_eof`` as recorded."""
        record = self.records[index]
        with self._lock:
            if self._file.closed:
                raise RuntimeError(f"recording {self.path} is closed")
            self._file.seek(record.data_offset)
            if record.codec == CODEC_RAW:
                buffer = np.empty(record.size, dtype=np.uint8)
                got = self._file.readinto(buffer.data)
            else:
                stored = self._file.read(record.stored)
                got = len(stored)
        if got != record.stored:
            raise self._fail(
                record.offset,
                index,
                f"truncated data: read {got} of {record.stored} bytes (the file shrank?)",
            )
        if record.codec == CODEC_ZSTD:
            buffer = self._decoded(record, index, stored)
        crc = zlib.crc32(buffer.data)
        if crc != record.crc32:
            raise self._fail(
                record.offset,
                index,
                f"corrupt data: CRC32 0x{crc:08x}, the header says 0x{record.crc32:08x}",
            )
        return Frame(
            buffer,
            record.width,
            record.height,
            record.stride,
            frame_id=record.frame_id,
            timestamp_sof=record.sof,
            timestamp_eof=record.eof,
        )

    def _decoded(self, record: RecordHeader, index: int, stored: bytes) -> np.ndarray:
        """The frame's buffer from its zstd frame, which must decode to exactly its size."""
        try:
            announced = zstandard.frame_content_size(stored)
            if announced != record.size:
                raise zstandard.ZstdError(
                    f"the zstd frame holds {announced} bytes, the header says {record.size}"
                )
            plain = zstandard.ZstdDecompressor().decompress(stored, max_output_size=record.size)
        except zstandard.ZstdError as exc:
            raise self._fail(record.offset, index, f"corrupt data: zstd: {exc}") from None
        if len(plain) != record.size:
            raise self._fail(
                record.offset,
                index,
                f"corrupt data: zstd decoded {len(plain)} bytes, the header says {record.size}",
            )
        return np.frombuffer(plain, dtype=np.uint8).copy()

    def close(self) -> None:
        with self._lock:
            self._file.close()
