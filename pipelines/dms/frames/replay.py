"""Replaying a recording as a camera.

:class:`ReplayCamera` replays a recording (:mod:`pipelines.dms.frames.recording` describes the format and
writes it; :mod:`pipelines.dms.frames.recording_reader` reads it — their names are re-exported here) as a
live source: frame ids and the bytes are as recorded, the timestamps are moved onto the service's
loop clock (:class:`~pipelines.dms.frames.source.RecordedTime`: the first frame's start of frame
is the moment the first frame is requested; later frames keep their recorded spacing, and each is
delivered at its end of frame), and the recorded timestamps stay on the frame as
``recorded_sof`` / ``recorded_eof``.
"""

from __future__ import annotations

import os
from pathlib import Path

from .frame import Frame
from .recorded import RecordedSource
from .recording_reader import RecordingReader

__all__ = ["ReplayCamera"]


class ReplayCamera(RecordedSource):
    """A recording replayed as a camera, re-timed onto the loop clock (see the module docstring),
    read ahead as every recorded source is (:class:`~pipelines.dms.frames.source.RecordedSource`).

    Opening the file (on the first request, or :meth:`open`) and reading each frame run on the
    camera's worker thread, bounded by ``read_timeout`` (:class:`~aio_runtime.CameraTimeout`). A missing file
    raises :class:`FileNotFoundError`, a truncated or corrupt one :class:`ReplayFormatError`.
    """

    def __init__(
        self, path: str | os.PathLike[str], *, read_timeout: float = 2.0, paced: bool = True
    ) -> None:
        super().__init__(paced=paced)
        self.path = Path(path)
        self._where = f"recording {self.path}"
        self.read_timeout = read_timeout
        self._reader: RecordingReader | None = None
        self._next = 0
        """The next record to read (the worker thread's)."""

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

    def _read_recorded(self) -> Frame | None:
        reader = self._reader
        if reader is None or self._next >= len(reader):
            return None
        frame = reader.read(self._next)
        self._next += 1
        return frame

    def _skip_recorded(self, recorded_sof: int) -> int:
        reader, start = self._reader, self._next
        if reader is None:
            return 0
        records = reader.records  # their headers say when: the frames are not read
        self._next = next(
            (k for k in range(start, len(records)) if records[k].sof >= recorded_sof),
            len(records),
        )
        return self._next - start

    async def aclose(self) -> None:
        """Close the file (after any read still running on its worker thread)."""
        self._closed = True
        reader, self._reader = self._reader, None
        try:
            self._withdraw()
            if reader is not None:
                await self._blocking(
                    reader.close,
                    awaited=f"closing recording {self.path}",
                    timeout=self.read_timeout,
                )
        finally:
            self._end_worker()
