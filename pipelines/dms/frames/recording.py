"""Recorded frames: our file format, and the recorder that writes it.

File format (all integers little-endian)::

    file header, 16 bytes
        magic       8 bytes   b"DMSNV12\\x00"
        version     u32       2 (1: the uncompressed layout below, still read)
        reserved    u32       0
    then one record per frame, until the end of the file:
        record header, 64 bytes (struct "<4sIIIQqqQQII")
            marker      4 bytes   b"FRME"
            width       u32       pixels
            height      u32       pixels
            stride      u32       bytes per Y / UV row (camerad's layout for width, height)
            frame_id    u64
            sof         i64       start of frame, ns, as the frame carried it when recorded
            eof         i64       end of frame, ns
            size        u64       bytes of the frame's NV12 buffer: camerad's size for width, height
            stored      u64       bytes of data that follow
            crc32       u32       zlib.crc32 of the NV12 buffer (as it is once decoded)
            codec       u32       0: the buffer as it is (stored == size); 1: zstd, one frame
                                  that holds its decoded size (the buffer compressed losslessly)
        data        ``stored`` bytes: the whole frame buffer, padding included, as the codec says

    version 1, as written before compression came: the same file header (version 1), and a
    record header of 56 bytes (struct "<4sIIIQqqQII": marker, width, height, stride, frame_id,
    sof, eof, size, crc32, reserved 0) followed by the ``size`` bytes of the buffer itself.

A file ends exactly after its last record. Frames may change geometry from one record to the next
(a recorded resolution change); start-of-frame times never go back. The recorder compresses each
frame with zstd (level 3; a cabin camera's frame is mostly smooth, and its buffer's padding is
zeros), storing a frame as it is where compressing would not make it smaller.

:class:`FrameRecorder` writes such a file; :func:`record_frames` records from any source.
:class:`~pipelines.dms.frames.recording_reader.RecordingReader` reads one, and
:class:`~pipelines.dms.frames.replay.ReplayCamera` replays it.
"""

from __future__ import annotations

import functools
import io
import os
import struct
import zlib
from collections.abc import AsyncIterable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Self, TypeVar

import anyio
import zstandard

from aio_runtime import CameraTimeout, Layer, WorkerThread, run_in_thread

from .frame import Frame

__all__ = [
    "CODEC_RAW",
    "CODEC_ZSTD",
    "FILE_HEADER",
    "FILE_MAGIC",
    "FORMAT_VERSION",
    "RECORD_HEADER",
    "RECORD_HEADER_V1",
    "RECORD_MARKER",
    "ZSTD_LEVEL",
    "Closing",
    "FrameRecorder",
    "RecordHeader",
    "ReplayFormatError",
    "record_frames",
]

FILE_MAGIC = b"DMSNV12\x00"
FORMAT_VERSION = 2
"""The version the recorder writes; the reader reads it and version 1."""
FILE_HEADER = struct.Struct("<8sII")
RECORD_MARKER = b"FRME"
RECORD_HEADER = struct.Struct("<4sIIIQqqQQII")
RECORD_HEADER_V1 = struct.Struct("<4sIIIQqqQII")
CODEC_RAW = 0
CODEC_ZSTD = 1
ZSTD_LEVEL = 3

T = TypeVar("T")


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
    """One record's header, and where its data starts in the file (``stored`` bytes there, in
    ``codec``, that decode to the ``size`` bytes of the frame's buffer)."""

    width: int
    height: int
    stride: int
    frame_id: int
    sof: int
    eof: int
    size: int
    crc32: int
    data_offset: int
    stored: int
    codec: int
    offset: int
    """Where the record (its header) starts in the file."""


class Closing:
    """``with`` closes it: leaving the block calls :meth:`close`, however it ends."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class FrameRecorder(Closing):
    """Writes frames to a recording (blocking file I/O: from async code, see
    :func:`record_frames`), each compressed with zstd unless ``compress=False``. Creates
    ``path``, or truncates a file there unless ``exist_ok=False`` (then
    :class:`FileExistsError`); use as a context manager or call :meth:`close`."""

    def __init__(
        self, path: str | os.PathLike[str], *, compress: bool = True, exist_ok: bool = True
    ) -> None:
        self.path = Path(path)
        self._compressor = zstandard.ZstdCompressor(level=ZSTD_LEVEL) if compress else None
        self._file: io.BufferedWriter | None = self.path.open("wb" if exist_ok else "xb")
        self._file.write(FILE_HEADER.pack(FILE_MAGIC, FORMAT_VERSION, 0))
        self.frames_written = 0
        self.bytes_written = FILE_HEADER.size
        """The file's size so far."""

    def write(self, frame: Frame) -> None:
        """Append one frame: its geometry, id, timestamps and the whole buffer."""
        if self._file is None:
            raise RuntimeError(f"recorder for {self.path} is closed")
        data: bytes | memoryview = frame.buffer.data
        codec = CODEC_RAW
        if self._compressor is not None:
            packed = self._compressor.compress(data)
            if len(packed) < frame.buffer.size:
                data, codec = packed, CODEC_ZSTD
        header = RECORD_HEADER.pack(
            RECORD_MARKER,
            frame.width,
            frame.height,
            frame.stride,
            frame.frame_id,
            frame.timestamp_sof,
            frame.timestamp_eof,
            frame.buffer.size,
            len(data),
            zlib.crc32(frame.buffer.data),
            codec,
        )
        self._file.write(header)
        self._file.write(data)
        self.frames_written += 1
        self.bytes_written += len(header) + len(data)

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
    compress: bool = True,
    exist_ok: bool = True,
) -> int:
    """Record frames from ``source`` to ``path`` until it ends or ``frames`` have been written;
    returns how many were. Opening the file, each write and closing it run on one worker thread,
    each bounded by ``write_timeout`` (:class:`~aio_runtime.CameraTimeout`); ``compress``,
    ``exist_ok``: as :class:`FrameRecorder` takes them. Does not close ``source``. Cancelled,
    it leaves a whole recording of the frames written so far."""
    if frames is not None and frames <= 0:
        return 0
    worker = WorkerThread("recording")

    async def blocking(call: Callable[[], T], awaited: str) -> T:
        return await run_in_thread(
            call,
            awaited=awaited,
            error=CameraTimeout,
            layer=Layer.CAMERA,
            timeout=write_timeout,
            worker=worker,
        )

    try:
        recorder = await blocking(
            functools.partial(FrameRecorder, path, compress=compress, exist_ok=exist_ok),
            f"creating recording {path}",
        )
        try:
            async for frame in source:
                await blocking(
                    functools.partial(recorder.write, frame),
                    f"recording frame {frame.frame_id} to {recorder.path}",
                )
                if frames is not None and recorder.frames_written >= frames:
                    break
        finally:
            with anyio.CancelScope(shield=True):  # bounded: by write_timeout
                await blocking(recorder.close, f"closing recording {path}")
        return recorder.frames_written
    finally:
        worker.close()
