"""Recorded frames: a file format of ours, a recorder, and a camera that replays a recording.

File format (version 1; all integers little-endian)::

    file header, 16 bytes
        magic       8 bytes   b"DMSNV12\\x00"
        version     u32       1
        reserved    u32       0
    then one record per frame, until the end of the file:
        record header, 56 bytes (struct "<4sIIIQqqQII")
            marker      4 bytes   b"FRME"
            width       u32       pixels
            height      u32       pixels
            stride      u32       bytes per Y / UV row (camerad's layout for width, height)
            frame_id    u64
            sof         i64       start of frame, ns, as the frame carried it when recorded
            eof         i64       end of frame, ns
            size        u64       bytes of NV12 data that follow: camerad's size for width, height
            crc32       u32       zlib.crc32 of those bytes
            reserved    u32       0
        NV12 data   ``size`` bytes: the whole frame buffer, padding included

A file ends exactly after its last record. Frames may change geometry from one record to the next
(a recorded resolution change); start-of-frame times never go back.

:class:`FrameRecorder` writes such a file; :func:`record_frames` records from any source.
:class:`RecordingReader` reads one: opening it checks the header and walks every record header
(not the data), so a truncated file, a bad marker, a geometry that is not camerad's or time going
back is reported at once as :class:`ReplayFormatError`, naming the record and its byte offset; a
record's data is checked against its CRC when it is read. :class:`ReplayCamera` replays a
recording as a live source: frame ids and the bytes are as recorded, the timestamps are moved onto
the service's loop clock (the first frame's start of frame is the moment the first frame is
requested; later frames keep their recorded spacing, and each is delivered at its end of frame),
and the recorded timestamps stay on the frame as ``recorded_sof`` / ``recorded_eof``.
"""

from __future__ import annotations

import functools
import io
import os
import struct
import threading
import zlib
from collections.abc import AsyncIterable
from dataclasses import dataclass
from pathlib import Path
from typing import Self

import numpy as np

from aio_runtime import CameraTimeout, Layer, WorkerThread, run_in_thread

from .camera import Frame, FrameError, nv12_layout
from .camera_sources import SourceBase, clock_ns

__all__ = [
    "FILE_HEADER",
    "FILE_MAGIC",
    "FORMAT_VERSION",
    "RECORD_HEADER",
    "RECORD_MARKER",
    "FrameRecorder",
    "RecordHeader",
    "RecordingReader",
    "ReplayCamera",
    "ReplayFormatError",
    "record_frames",
]

FILE_MAGIC = b"DMSNV12\x00"
FORMAT_VERSION = 1
FILE_HEADER = struct.Struct("<8sII")
RECORD_MARKER = b"FRME"
RECORD_HEADER = struct.Struct("<4sIIIQqqQII")


class ReplayFormatError(ValueError):
    """A recording that is truncated or corrupt. ``path``, ``offset`` (bytes from the start of the
    file) and ``record`` (0-based record index, ``None`` for the file header) say where."""

    def __init__(self, path: Path, offset: int, record: int | None, problem: str) -> None:
        where = "file header" if record is None else f"frame record {record}"
        super().__init__(f"{path}: {where} at byte {offset}: {problem}")
        self.path = path
        self.offset = offset
        self.record = record


@dataclass(frozen=True)
class RecordHeader:
    """One record's header, and where its NV12 data starts in the file."""

    width: int
    height: int
    stride: int
    frame_id: int
    sof: int
    eof: int
    size: int
    crc32: int
    data_offset: int


class _Closing:
    """``with`` closes it: leaving the block calls :meth:`close`, however it ends."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class FrameRecorder(_Closing):
    """Writes frames to a recording (blocking file I/O: from async code, see
    :func:`record_frames`). Creates or truncates ``path``; use as a context manager or call
    :meth:`close`."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._file: io.BufferedWriter | None = self.path.open("wb")
        self._file.write(FILE_HEADER.pack(FILE_MAGIC, FORMAT_VERSION, 0))
        self.frames_written = 0

    def write(self, frame: Frame) -> None:
        """Append one frame: its geometry, id, timestamps and the whole buffer."""
        if self._file is None:
            raise RuntimeError(f"recorder for {self.path} is closed")
        data = frame.buffer.data
        header = RECORD_HEADER.pack(
            RECORD_MARKER,
            frame.width,
            frame.height,
            frame.stride,
            frame.frame_id,
            frame.timestamp_sof,
            frame.timestamp_eof,
            frame.buffer.size,
            zlib.crc32(data),
            0,
        )
        self._file.write(header)
        self._file.write(data)
        self.frames_written += 1

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


async def record_frames(
    source: AsyncIterable[Frame],
    path: str | os.PathLike[str],
    *,
    frames: int | None = None,
    write_timeout: float = 2.0,
) -> int:
    """Record frames from ``source`` to ``path`` until it ends or ``frames`` have been written;
    returns how many were. Each write runs on one worker thread, bounded by ``write_timeout``
    (:class:`~aio_runtime.CameraTimeout`). Does not close ``source``."""
    if frames is not None and frames <= 0:
        return 0
    worker = WorkerThread("recording")
    try:
        with FrameRecorder(path) as recorder:
            async for frame in source:
                await run_in_thread(
                    functools.partial(recorder.write, frame),
                    awaited=f"recording frame {frame.frame_id} to {recorder.path}",
                    error=CameraTimeout,
                    layer=Layer.CAMERA,
                    timeout=write_timeout,
                    worker=worker,
                )
                if frames is not None and recorder.frames_written >= frames:
                    break
            return recorder.frames_written
    finally:
        worker.close()


class RecordingReader(_Closing):
    """Reads a recording (blocking file I/O). Opening it validates the file header and every
    record header; :meth:`read` returns a record's frame, stamped with its recorded timestamps."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._file: io.BufferedReader = self.path.open("rb")
        self._lock = threading.Lock()  # a read and close() never overlap
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
        if version != FORMAT_VERSION:
            raise self._fail(
                0, None, f"format version {version}, this reader reads {FORMAT_VERSION}"
            )
        records: list[RecordHeader] = []
        offset = FILE_HEADER.size
        while offset < end:
            record = self._record_header(
                offset, len(records), end, records[-1] if records else None
            )
            records.append(record)
            offset = record.data_offset + record.size
        return records

    def _record_header(
        self, offset: int, index: int, end: int, previous: RecordHeader | None
    ) -> RecordHeader:
        self._file.seek(offset)
        raw = self._file.read(RECORD_HEADER.size)
        if len(raw) < RECORD_HEADER.size:
            raise self._fail(
                offset, index, f"truncated header: {len(raw)} of {RECORD_HEADER.size} bytes"
            )
        marker, width, height, stride, frame_id, sof, eof, size, crc, _ = RECORD_HEADER.unpack(raw)
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
        if eof < sof:
            raise self._fail(offset, index, f"end of frame {eof} ns is before its start {sof} ns")
        if previous is not None and sof < previous.sof:
            raise self._fail(
                offset,
                index,
                f"start of frame {sof} ns goes back from the previous record's {previous.sof} ns",
            )
        data_offset = offset + RECORD_HEADER.size
        if data_offset + size > end:
            raise self._fail(
                offset,
                index,
                f"truncated data: the header announces {size} bytes of NV12 data, "
                f"the file holds {end - data_offset}",
            )
        return RecordHeader(width, height, stride, frame_id, sof, eof, size, crc, data_offset)

    def __len__(self) -> int:
        return len(self.records)

    def read(self, index: int) -> Frame:
        """Frame ``index``, with ``timestamp_sof`` / ``timestamp_eof`` as recorded."""
        record = self.records[index]
        buffer = np.empty(record.size, dtype=np.uint8)
        with self._lock:
            if self._file.closed:
                raise RuntimeError(f"recording {self.path} is closed")
            self._file.seek(record.data_offset)
            got = self._file.readinto(buffer.data)
        if got != record.size:
            raise self._fail(
                record.data_offset - RECORD_HEADER.size,
                index,
                f"truncated data: read {got} of {record.size} bytes (the file shrank?)",
            )
        crc = zlib.crc32(buffer.data)
        if crc != record.crc32:
            raise self._fail(
                record.data_offset - RECORD_HEADER.size,
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

    def close(self) -> None:
        with self._lock:
            self._file.close()


class ReplayCamera(SourceBase):
    """A recording replayed as a camera, re-timed onto the loop clock (see the module docstring).

    Opening the file (on the first request, or :meth:`open`) and reading each frame run on the
    camera's worker thread, bounded by ``read_timeout`` (:class:`~aio_runtime.CameraTimeout`). A missing file
    raises :class:`FileNotFoundError`, a truncated or corrupt one :class:`ReplayFormatError`.
    """

    def __init__(
        self, path: str | os.PathLike[str], *, read_timeout: float = 2.0, paced: bool = True
    ) -> None:
        self.path = Path(path)
        self.read_timeout = read_timeout
        self.paced = paced
        self._reader: RecordingReader | None = None
        self._next = 0
        self._origin_ns = 0

    async def open(self) -> RecordingReader:
        """Open and validate the recording (done by the first frame request if not before)."""
        if self._reader is None:
            if self._closed:
                raise RuntimeError(f"replay of {self.path} is closed")
            self._reader = await self._blocking(
                lambda: RecordingReader(self.path),
                awaited=f"opening recording {self.path}",
                timeout=self.read_timeout,
            )
            self.length = len(self._reader)
        return self._reader

    async def _next_frame(self) -> Frame:
        reader = await self.open()
        index = self._next
        if index >= len(reader):
            await self.aclose()
            raise StopAsyncIteration
        recorded = await self._blocking(
            lambda: reader.read(index),
            awaited=f"reading frame record {index} of {self.path}",
            timeout=self.read_timeout,
        )
        self._next += 1
        if not self.paced:  # stamped as it is read
            sof = clock_ns()
        else:
            if index == 0:
                self._origin_ns = clock_ns()
            sof = self._origin_ns + (recorded.timestamp_sof - reader.records[0].sof)
        return recorded.retimed(sof, sof + recorded.timestamp_eof - recorded.timestamp_sof)

    async def aclose(self) -> None:
        """Close the file (after any read still running on its worker thread)."""
        self._closed = True
        reader, self._reader = self._reader, None
        try:
            if reader is not None:
                await self._blocking(
                    reader.close,
                    awaited=f"closing recording {self.path}",
                    timeout=self.read_timeout,
                )
        finally:
            self._end_worker()
