"""Video decoded with PyAV (FFmpeg), the one video stack of the service: a video file as a camera
(:class:`VideoFileCamera`), and the conversion of a decoded frame to NV12 in camerad's layout that
route segments share (:func:`nv12_from_video`).

A video file's frames are converted to limited-range BT.601 4:2:0 where they are not already
(a JPEG-range frame, e.g. of MJPG, other pixel formats, a frame resized to ``size``: by FFmpeg's
swscale, area interpolation), then their chroma interleaved into NV12 rows, padded to the stride.
Opening and decoding block, so they run on the camera's worker thread (one for its life, not one
per frame), each under its own bound, and the event loop stays free. Frames are read ahead and
paced like a camera's (see :mod:`pipelines.dms.frames.recorded`).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from .frame import (
    CameraConfig,
    Frame,
    FrameGeometryError,
    UnknownCameraError,
    camera_for_resolution,
    nv12_layout,
)
from .recorded import RecordedSource
from .source import period_ns

if TYPE_CHECKING:
    import av

__all__ = ["VideoDecodeError", "VideoFileCamera", "ffmpeg_said", "nv12_from_video"]

Buffer = npt.NDArray[np.uint8]

_KEPT_FORMATS = ("yuv420p", "yuvj420p", "nv12")
"""4:2:0 pixel formats whose bytes :func:`nv12_from_video` copies as they are."""


class VideoDecodeError(ValueError):
    """A video file FFmpeg cannot open or decode."""


def ffmpeg_said(error: Exception) -> str:
    """What FFmpeg said (its message without the error number and the call), or the error."""
    return getattr(error, "strerror", None) or str(error) or type(error).__name__


def _plane(plane: av.video.plane.VideoPlane, rows: int, columns: int) -> Buffer:
    data = np.frombuffer(memoryview(plane), dtype=np.uint8)
    return data[: rows * plane.line_size].reshape(rows, plane.line_size)[:, :columns]


def nv12_from_video(frame: av.VideoFrame) -> tuple[Buffer, int, int]:
    """A decoded video frame as an NV12 buffer in camerad's layout (padding 0), with its width
    and height. 4:2:0 frames (``yuv420p``, ``yuvj420p``, ``nv12``) keep their bytes; any other
    pixel format is converted to ``yuv420p`` first. :class:`FrameGeometryError` for odd
    dimensions."""
    if frame.format.name not in _KEPT_FORMATS:
        frame = frame.reformat(format="yuv420p")
    width, height = frame.width, frame.height
    layout = nv12_layout(width, height)
    stride, rows = layout.stride, height // 2
    buffer = np.zeros(layout.size, dtype=np.uint8)
    buffer[: height * stride].reshape(height, stride)[:, :width] = _plane(
        frame.planes[0], height, width
    )
    uv = buffer[layout.uv_offset : layout.uv_offset + rows * stride].reshape(rows, stride)
    if frame.format.name == "nv12":
        uv[:, :width] = _plane(frame.planes[1], rows, width)
    else:
        uv[:, 0:width:2] = _plane(frame.planes[1], rows, width // 2)
        uv[:, 1:width:2] = _plane(frame.planes[2], rows, width // 2)
    return buffer, width, height


class _Decoder:
    """The file's first video stream, decoded on the camera's worker thread only."""

    def __init__(self, path: Path) -> None:
        import av

        self.path = path
        try:
            self._container = av.open(str(path))
        except av.error.FFmpegError as exc:
            raise VideoDecodeError(
                f"FFmpeg cannot open video file {path} (not a video, or no decoder for it): "
                f"{ffmpeg_said(exc)}"
            ) from None
        if not self._container.streams.video:
            self._container.close()
            raise VideoDecodeError(f"video file {path} holds no video stream")
        self._stream = self._container.streams.video[0]
        self._stream.codec_context.thread_count = 1
        rate = self._stream.average_rate or self._stream.guessed_rate
        self.rate = float(rate) if isinstance(rate, Fraction) and rate > 0 else None
        """The file's frame rate (None: it reports none)."""
        self.frames = self._stream.frames or None
        """The frames the file says it holds (None: it does not say)."""
        self._frames: Iterator[av.VideoFrame] = self._container.decode(self._stream)
        self._reformatter = av.video.reformatter.VideoReformatter()

    def read(self, size: tuple[int, int] | None, *, rewind: bool) -> av.VideoFrame | None:
        """The next frame as a limited-range 4:2:0 frame of ``size`` (None: its own); at the
        end, None, or (``rewind``) the first frame again."""
        import av

        try:
            frame = next(self._frames, None)
            if frame is None and rewind:
                self._container.seek(0)
                self._frames = self._container.decode(self._stream)
                frame = next(self._frames, None)
        except av.error.FFmpegError as exc:
            raise VideoDecodeError(
                f"video file {self.path} cannot be decoded: {ffmpeg_said(exc)}"
            ) from None
        if frame is None:
            return None
        full_range = (
            frame.format.name.startswith("yuvj")
            or frame.color_range == av.video.reformatter.ColorRange.JPEG
        )
        own = (frame.width, frame.height)
        if size is None and not full_range and frame.format.name in _KEPT_FORMATS:
            return frame
        width, height = own if size is None else size
        return self._reformatter.reformat(
            frame,
            width=width,
            height=height,
            format="yuv420p",
            interpolation="AREA",
            src_color_range="JPEG" if full_range else None,
            dst_color_range="MPEG",
        )

    def close(self) -> None:
        self._container.close()


class VideoFileCamera(RecordedSource):
    """Frames decoded from a video file (any container and codec FFmpeg reads), converted to
    NV12 and paced like a camera.

    * ``fps`` — pace (default: the file's own rate; a file that reports none needs one).
    * ``size`` — (width, height) or a camera: resize every frame to it (e.g. to a cabin camera's
      geometry, for which a warp exists). Default: the file's own size, which must be even.
    * ``loop`` — start over at the end of the file instead of ending.
    * ``readout_ns`` — end of frame minus start (default: the cabin camera of that size's readout,
      else 0).
    * ``decode_timeout`` — bound on opening the file and on decoding one frame, which run on a
      worker thread so the event loop stays free; a decode that overruns raises
      :class:`~aio_runtime.CameraTimeout`.

    A missing file raises :class:`FileNotFoundError`; a file FFmpeg cannot open or that yields no
    frame raises :class:`VideoDecodeError`, both when the first frame is requested (or on
    :meth:`open`). Frames are read ahead, as every recorded source's
    (:class:`~pipelines.dms.frames.recorded.RecordedSource`); a frame's recorded times are its
    index times the frame period (0 for a file replayed that reports no rate).
    """

    _reading = "decoding"

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        fps: float | None = None,
        size: tuple[int, int] | CameraConfig | None = None,
        loop: bool = False,
        readout_ns: int | None = None,
        decode_timeout: float = 2.0,
        paced: bool = True,
    ) -> None:
        super().__init__(paced=paced)
        self.path = Path(path)
        self._where = f"video file {self.path}"
        self.read_timeout = decode_timeout
        self.fps = fps
        if fps is not None:
            period_ns(fps)
        self.size = (size.width, size.height) if isinstance(size, CameraConfig) else size
        if self.size is not None:
            nv12_layout(*self.size)
        self.loop = loop
        self.readout_ns = readout_ns
        self.decode_timeout = decode_timeout
        self._decoder: _Decoder | None = None
        self._lock = threading.Lock()  # one decoder call at a time: a read, or the close
        self._period_ns = 0
        self._next_id = 0
        """The next frame's id (the worker thread's)."""

    async def open(self) -> None:
        """Open the file (on a worker thread); done by the first frame request if not before."""
        if self._decoder is not None:
            return
        if self._closed:
            raise RuntimeError(f"video camera for {self.path} is closed")
        if not self.path.is_file():
            raise FileNotFoundError(f"video file {self.path} does not exist (or is not a file)")
        decoder = await self._blocking(
            lambda: _Decoder(self.path),
            awaited=f"opening video file {self.path}",
            timeout=self.decode_timeout,
        )
        self._decoder = decoder
        self.length = decoder.frames if not self.loop else None
        if self.fps is None:
            self.fps = decoder.rate
        if self.fps is None and self.paced:
            await self._blocking(
                self._close_blocking,
                awaited=f"closing video file {self.path}",
                timeout=self.decode_timeout,
            )
            raise VideoDecodeError(f"video file {self.path} reports no frame rate; pass fps=")
        self._period_ns = 0 if self.fps is None else period_ns(self.fps)

    def _read_blocking(self, frame_id: int) -> tuple[Buffer, int, int] | None:
        """The next frame as (NV12 buffer, width, height), or None at the end of the file (or
        once closed)."""
        with self._lock:
            decoder = self._decoder
            if decoder is None:
                return None
            decoded = decoder.read(self.size, rewind=self.loop and frame_id > 0)
        if decoded is None:
            if frame_id == 0:
                raise VideoDecodeError(f"video file {self.path} yields no decodable frame")
            return None
        if decoded.width % 2 or decoded.height % 2:
            raise VideoDecodeError(
                f"video file {self.path} is {decoded.width}x{decoded.height}; NV12 needs even "
                "dimensions (pass size= to resize)"
            )
        try:
            return nv12_from_video(decoded)
        except FrameGeometryError as exc:
            raise VideoDecodeError(f"video file {self.path}: {exc}") from None

    def _read_recorded(self) -> Frame | None:
        frame_id = self._next_id
        decoded = self._read_blocking(frame_id)
        if decoded is None:
            return None
        buffer, width, height = decoded
        self._next_id += 1
        readout = self.readout_ns
        if readout is None:
            try:
                readout = camera_for_resolution(width, height).readout_ns
            except UnknownCameraError:
                readout = 0
        sof = frame_id * self._period_ns
        return Frame(
            buffer,
            width,
            height,
            nv12_layout(width, height).stride,
            frame_id=frame_id,
            timestamp_sof=sof,
            timestamp_eof=sof + readout,
        )

    async def aclose(self) -> None:
        """Close the decoder (after any decode still running on its worker thread)."""
        self._closed = True
        try:
            self._withdraw()
            if self._decoder is not None:
                await self._blocking(
                    self._close_blocking,
                    awaited=f"closing video file {self.path}",
                    timeout=self.decode_timeout,
                )
        finally:
            self._end_worker()

    def _close_blocking(self) -> None:
        with self._lock:
            if self._decoder is not None:
                self._decoder.close()
                self._decoder = None
