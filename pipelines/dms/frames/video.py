"""A camera source that decodes a video file: each frame converted to NV12 in camerad's layout.

OpenCV decodes (``cv2.VideoCapture``) to BGR; :func:`bgr_to_nv12` converts with OpenCV's BT.601
limited-range I420 conversion and interleaves the chroma into NV12 rows, padded to the stride.
Opening and decoding block, so they run on the camera's worker thread (one for its life, not one
per frame), each under its own bound, and the event loop stays free. Frames are paced like a camera's (see
:mod:`pipelines.dms.frames.source`).
"""

from __future__ import annotations

import math
import os
import threading
from pathlib import Path

import cv2
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

__all__ = ["VideoDecodeError", "VideoFileCamera", "bgr_to_nv12"]

Buffer = npt.NDArray[np.uint8]


class VideoDecodeError(ValueError):
    """A video file OpenCV cannot open or decode."""


def bgr_to_nv12(bgr: npt.NDArray[np.uint8]) -> Buffer:
    """A height x width x 3 BGR image as an NV12 buffer in camerad's layout (padding 0).

    Uses OpenCV's BT.601 limited-range conversion to planar I420 (Y, then U and V at quarter
    size), then interleaves U and V into NV12's chroma rows.
    """
    if bgr.ndim != 3 or bgr.shape[2] != 3 or bgr.dtype != np.uint8:
        raise FrameGeometryError(
            f"expected a height x width x 3 uint8 BGR image, got {bgr.dtype} {bgr.shape}",
            expected="(height, width, 3) uint8",
            observed=(str(bgr.dtype), bgr.shape),
        )
    height, width = bgr.shape[:2]
    layout = nv12_layout(width, height)
    i420 = cv2.cvtColor(bgr, cv2.COLOR_BGR2YUV_I420)
    quarter = (height // 2) * (width // 2)
    chroma = i420[height:].reshape(-1)
    buffer = np.zeros(layout.size, dtype=np.uint8)
    y = buffer[: height * layout.stride].reshape(height, layout.stride)
    y[:, :width] = i420[:height]
    uv_rows = buffer[layout.uv_offset : layout.uv_offset + (height // 2) * layout.stride]
    uv = uv_rows.reshape(height // 2, layout.stride)[:, :width]
    u = chroma[:quarter].reshape(height // 2, width // 2)
    v = chroma[quarter:].reshape(height // 2, width // 2)
    uv[...] = cv2.merge([u, v]).reshape(height // 2, width)  # U,V,U,V...
    return buffer


class VideoFileCamera(RecordedSource):
    """Frames decoded from a video file, converted to NV12 and paced like a camera.

    * ``fps`` — pace (default: the file's own rate; a file that reports none needs one).
    * ``size`` — (width, height) or a camera: resize every frame to it (e.g. to a cabin camera's
      geometry, for which a warp exists). Default: the file's own size, which must be even.
    * ``loop`` — start over at the end of the file instead of ending.
    * ``readout_ns`` — end of frame minus start (default: the cabin camera of that size's readout,
      else 0).
    * ``decode_timeout`` — bound on opening the file and on decoding one frame, which run on a
      worker thread so the event loop stays free; a decode that overruns raises
      :class:`~aio_runtime.CameraTimeout`.

    A missing file raises :class:`FileNotFoundError`; a file OpenCV cannot open or that yields no
    frame raises :class:`VideoDecodeError`, both when the first frame is requested (or on
    :meth:`open`). Frames are read ahead, as every recorded source's
    (:class:`~pipelines.dms.frames.source.RecordedSource`); a frame's recorded times are its
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
        self._capture: cv2.VideoCapture | None = None
        self._lock = threading.Lock()  # one OpenCV call at a time: a read, or the release
        self._period_ns = 0
        self._next_id = 0
        """The next frame's id (the worker thread's)."""

    async def open(self) -> None:
        """Open the file (on a worker thread); done by the first frame request if not before."""
        if self._capture is not None:
            return
        if self._closed:
            raise RuntimeError(f"video camera for {self.path} is closed")
        if not self.path.is_file():
            raise FileNotFoundError(f"video file {self.path} does not exist (or is not a file)")
        capture, rate = await self._blocking(
            self._open_blocking,
            awaited=f"opening video file {self.path}",
            timeout=self.decode_timeout,
        )
        self._capture = capture
        frames = capture.get(cv2.CAP_PROP_FRAME_COUNT)
        self.length = int(frames) if frames > 0 and not self.loop else None
        if self.fps is None and math.isfinite(rate) and rate > 0:
            self.fps = rate
        if self.fps is None and self.paced:
            capture.release()
            self._capture = None
            raise VideoDecodeError(
                f"video file {self.path} reports no frame rate ({rate!r}); pass fps="
            )
        self._period_ns = 0 if self.fps is None else period_ns(self.fps)

    def _open_blocking(self) -> tuple[cv2.VideoCapture, float]:
        capture = cv2.VideoCapture(str(self.path))
        if not capture.isOpened():
            capture.release()
            raise VideoDecodeError(
                f"OpenCV cannot open video file {self.path} (not a video, or no decoder for it)"
            )
        return capture, float(capture.get(cv2.CAP_PROP_FPS))

    def _read_blocking(self, frame_id: int) -> tuple[Buffer, int, int] | None:
        """The next frame as (NV12 buffer, width, height), or None at the end of the file (or
        once closed)."""
        with self._lock:
            capture = self._capture
            if capture is None:
                return None
            ok, image = capture.read()
            if not ok and self.loop and frame_id > 0:
                capture.set(cv2.CAP_PROP_POS_FRAMES, 0)
                ok, image = capture.read()
        if not ok:
            if frame_id == 0:
                raise VideoDecodeError(f"video file {self.path} yields no decodable frame")
            return None
        bgr: Buffer = np.asarray(image, dtype=np.uint8)
        height, width = bgr.shape[:2]
        if self.size is not None and (width, height) != self.size:
            bgr = np.asarray(cv2.resize(bgr, self.size, interpolation=cv2.INTER_AREA))
            width, height = self.size
        elif width % 2 or height % 2:
            raise VideoDecodeError(
                f"video file {self.path} is {width}x{height}; NV12 needs even dimensions "
                "(pass size= to resize)"
            )
        return bgr_to_nv12(bgr), width, height

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
        """Release the decoder (after any decode still running on its worker thread)."""
        self._closed = True
        try:
            self._withdraw()
            if self._capture is not None:
                await self._blocking(
                    self._release_blocking,
                    awaited=f"releasing video file {self.path}",
                    timeout=self.decode_timeout,
                )
        finally:
            self._end_worker()

    def _release_blocking(self) -> None:
        with self._lock:
            if self._capture is not None:
                self._capture.release()
                self._capture = None
