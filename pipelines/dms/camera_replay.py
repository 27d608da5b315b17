"""Replaying a recording as a camera.

:class:`ReplayCamera` replays a recording (:mod:`pipelines.dms.recording` describes the format and
writes it; :mod:`pipelines.dms.recording_reader` reads it — their names are re-exported here) as a
live source: frame ids and the bytes are as recorded, the timestamps are moved onto the service's
loop clock (:class:`~pipelines.dms.camera_sources.RecordedTime`: the first frame's start of frame
is the moment the first frame is requested; later frames keep their recorded spacing, and each is
delivered at its end of frame), and the recorded timestamps stay on the frame as
``recorded_sof`` / ``recorded_eof``.
"""

from __future__ import annotations

import os
from pathlib import Path

from .camera import Frame
from .camera_sources import RecordedTime, SourceBase
from .recording_reader import RecordingReader

__all__ = ["ReplayCamera"]


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
        self._clock = RecordedTime(paced=paced)

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
        return self._clock.retimed(recorded)

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
