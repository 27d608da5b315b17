"""Cabin camera frames: the two camera geometries, the NV12 buffer layout, and the frame itself.

What a frame is, as openpilot's camerad delivers it (spec/dms-contract.md §1.3, §1.5, §5):

* **Cameras.** Two cabin cameras exist: ``ar_ox_fisheye`` (tici/tizi, OX03C10 or AR0231 sensor,
  1928x1208, focal 567 px) and ``os_fisheye`` (mici, OS04C10 binned by 2, 1344x760, focal
  425.25 px). Both are pinhole cameras with the principal point at the image centre and run at
  20 Hz. :func:`camera_by_name` and :func:`camera_for_resolution` look them up.
* **NV12 layout.** A frame is one flat ``uint8`` buffer: ``height`` Y rows of ``stride`` bytes
  (only the first ``width`` bytes of a row are image), then, at ``uv_offset``, ``height / 2`` rows
  of interleaved U,V bytes with the same stride, then padding up to ``size``.
  :func:`nv12_layout` computes the numbers exactly as camerad does; padding bytes carry no image.
* **Frame identity and time.** ``frame_id`` counts capture periods from 0; a frame camerad drops
  is never published, so ids skip. ``timestamp_sof`` is the start of frame, ``timestamp_eof`` the
  start plus the sensor's readout time, both integer nanoseconds. camerad reads them from
  CLOCK_BOOTTIME; our sources read them from the running event loop's clock
  (:func:`pipelines.dms.frames.source.clock_ns`, the clock every runtime deadline uses), so a
  frame's age is ``clock_ns() - frame.timestamp_sof`` and virtual-time tests see consistent times.

A :class:`Frame` checks its buffer against its declared geometry when it is built: a buffer of the
wrong size, dtype or shape, a stride that is not the layout's, or odd dimensions raise
:class:`FrameGeometryError`, whose message says what was expected. Sources (synthetic, video
file, recorded replay) live in :mod:`pipelines.dms.frames.synthetic`,
:mod:`pipelines.dms.frames.video` and :mod:`pipelines.dms.frames.replay`; they all satisfy
:class:`pipelines.dms.frames.source.FrameSource`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

__all__ = [
    "AR_OX_FISHEYE",
    "CABIN_CAMERAS",
    "OS_FISHEYE",
    "CameraConfig",
    "Frame",
    "FrameError",
    "FrameGeometryError",
    "Nv12Layout",
    "UnknownCameraError",
    "camera_by_name",
    "camera_for_resolution",
    "nv12_layout",
    "other_camera",
]

Buffer = npt.NDArray[np.uint8]


class FrameError(ValueError):
    """A frame that cannot be accepted as it is (bad id or timestamps, or bad geometry)."""


class FrameGeometryError(FrameError):
    """A buffer that does not match its declared geometry.

    ``expected`` and ``observed`` hold the mismatching quantity (a size, a stride, a dtype...).
    """

    def __init__(self, message: str, *, expected: object = None, observed: object = None) -> None:
        super().__init__(message)
        self.expected = expected
        self.observed = observed


class UnknownCameraError(ValueError):
    """A camera name or resolution that is not one of the cabin cameras."""


# --- the NV12 layout (spec §1.5) ------------------------------------------------------------


def _align(value: int, alignment: int) -> int:
    return -(-value // alignment) * alignment


@dataclass(frozen=True)
class Nv12Layout:
    """Where the planes of a ``width`` x ``height`` NV12 frame live in its buffer, in bytes.

    ``stride`` is the length of a Y row and of a UV row; ``y_height`` and ``uv_height`` are the
    scanlines reserved for each plane (aligned; only ``height`` and ``height / 2`` hold image);
    ``uv_offset`` is where the UV plane starts; ``size`` the whole buffer, padding included.
    """

    width: int
    height: int
    stride: int
    y_height: int
    uv_height: int
    uv_offset: int
    size: int

    @property
    def y_size(self) -> int:
        """Bytes reserved for the Y plane (``stride * y_height``, equal to ``uv_offset``)."""
        return self.stride * self.y_height

    def describe(self) -> str:
        return (
            f"NV12 {self.width}x{self.height}: stride {self.stride}, Y {self.y_height} rows, "
            f"UV at {self.uv_offset} ({self.uv_height} rows), {self.size} bytes"
        )


def nv12_layout(width: int, height: int) -> Nv12Layout:
    """camerad's NV12 layout for a ``width`` x ``height`` frame (``get_nv12_info``).

    stride = align(width, 128); y_height = align(height, 32); uv_height = align(height / 2, 16);
    uv_offset = stride · y_height; size: Y plane + UV plane + 4096, plus max(16384, 8 · stride),
    aligned to 4096, plus align(width, 512) · 512, aligned to 4096. 1928x1208 gives stride 2048 and
    4 804 608 bytes; 1344x760 gives 1408 and 2 428 928.

    Raises :class:`FrameGeometryError` unless both dimensions are positive and even (4:2:0 chroma
    covers 2x2 pixel blocks).
    """
    for name, value in (("width", width), ("height", height)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise FrameGeometryError(
                f"NV12 {name} must be an integer, got {type(value).__name__}",
                expected="int",
                observed=type(value).__name__,
            )
    width, height = int(width), int(height)
    if width <= 0 or height <= 0 or width % 2 or height % 2:
        raise FrameGeometryError(
            f"NV12 needs positive, even width and height (4:2:0 chroma); got {width}x{height}",
            expected="positive even dimensions",
            observed=(width, height),
        )
    stride = _align(width, 128)
    y_height = _align(height, 32)
    uv_height = _align(height // 2, 16)
    uv_offset = stride * y_height
    size = uv_offset + (stride * uv_height + 4096) + max(16384, 8 * stride)
    size = _align(size, 4096) + _align(width, 512) * 512
    return Nv12Layout(
        width=width,
        height=height,
        stride=stride,
        y_height=y_height,
        uv_height=uv_height,
        uv_offset=uv_offset,
        size=_align(size, 4096),
    )


# --- the cabin cameras (spec §1.3, §5) ------------------------------------------------------


@dataclass(frozen=True)
class CameraConfig:
    """One cabin camera: its output geometry, lens and timing.

    ``focal`` is in pixels; the principal point is the image centre. ``readout_ns`` is what camerad
    adds to the start of frame to stamp its end (the sensor's readout time).
    """

    name: str
    sensors: tuple[str, ...]
    devices: tuple[str, ...]
    width: int
    height: int
    focal: float
    readout_ns: int
    fps: float = 20.0

    @property
    def cx(self) -> float:
        return self.width / 2

    @property
    def cy(self) -> float:
        return self.height / 2

    @property
    def intrinsics(self) -> npt.NDArray[np.float64]:
        """K = [[f, 0, cx], [0, f, cy], [0, 0, 1]] (a new float64 array each call)."""
        return np.array(
            [[self.focal, 0.0, self.cx], [0.0, self.focal, self.cy], [0.0, 0.0, 1.0]],
            dtype=np.float64,
        )

    @property
    def size(self) -> tuple[int, int]:
        """(width, height)."""
        return (self.width, self.height)

    @property
    def layout(self) -> Nv12Layout:
        return nv12_layout(self.width, self.height)

    @property
    def period_ns(self) -> int:
        return round(1e9 / self.fps)


AR_OX_FISHEYE = CameraConfig(
    name="ar_ox_fisheye",
    sensors=("ox03c10", "ar0231"),
    devices=("tici", "tizi"),
    width=1928,
    height=1208,
    focal=567.0,
    readout_ns=14_697_000,  # OX03C10
)
OS_FISHEYE = CameraConfig(
    name="os_fisheye",
    sensors=("os04c10",),
    devices=("mici",),
    width=1344,
    height=760,
    focal=567.0 * 3 / 4,  # 2688x1520 binned by 2
    readout_ns=11_000_000,
)
CABIN_CAMERAS: tuple[CameraConfig, ...] = (AR_OX_FISHEYE, OS_FISHEYE)


def camera_by_name(name: str) -> CameraConfig:
    """The cabin camera called ``name``: its config name, a sensor or a device type
    (``"ar_ox_fisheye"``, ``"ox03c10"``, ``"mici"``...), case-insensitive."""
    key = name.lower()
    for camera in CABIN_CAMERAS:
        if key == camera.name or key in camera.sensors or key in camera.devices:
            return camera
    known = ", ".join(
        f"{c.name} (sensors {'/'.join(c.sensors)}; devices {'/'.join(c.devices)})"
        for c in CABIN_CAMERAS
    )
    raise UnknownCameraError(f"no cabin camera called {name!r}; known: {known}")


def camera_for_resolution(width: int, height: int) -> CameraConfig:
    """The cabin camera whose output is ``width`` x ``height``."""
    for camera in CABIN_CAMERAS:
        if (camera.width, camera.height) == (width, height):
            return camera
    known = ", ".join(f"{c.width}x{c.height} ({c.name})" for c in CABIN_CAMERAS)
    raise UnknownCameraError(f"no cabin camera produces {width}x{height}; known: {known}")


def other_camera(camera: CameraConfig) -> CameraConfig:
    """The other cabin camera (the geometry a mid-stream resolution change switches to)."""
    return OS_FISHEYE if camera == AR_OX_FISHEYE else AR_OX_FISHEYE


# --- frames ---------------------------------------------------------------------------------


def _as_int(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise FrameError(f"{what} must be an integer, got {type(value).__name__}")
    return int(value)


def _check_buffer(buffer: object, layout: Nv12Layout, where: str) -> None:
    """Raise :class:`FrameGeometryError` unless ``buffer`` is a flat, contiguous uint8 array of
    the layout's size."""
    expected: object
    observed: object
    if not isinstance(buffer, np.ndarray):
        problem, expected, observed = (
            "must be a numpy array",
            "numpy.ndarray",
            type(buffer).__name__,
        )
    elif buffer.dtype != np.uint8:
        problem, expected, observed = "must be uint8", np.dtype(np.uint8), buffer.dtype
    elif buffer.ndim != 1:
        problem, expected, observed = "must be flat (1-D)", (layout.size,), buffer.shape
    elif buffer.size != layout.size:
        problem, expected, observed = "has the wrong size", layout.size, buffer.size
    elif not buffer.flags.c_contiguous:
        problem, expected, observed = "must be contiguous", "contiguous", "strided"
    else:
        return
    raise FrameGeometryError(
        f"{where}: the buffer {problem}: expected {expected}, got {observed} ({layout.describe()})",
        expected=expected,
        observed=observed,
    )


@dataclass(frozen=True, eq=False)
class Frame:
    """One NV12 camera frame.

    The frame owns ``buffer`` (sources never reuse a buffer that anything still refers to: a
    frame, a view of it), so a consumer may keep a frame as long as it likes. ``y`` and ``uv``
    are views into the buffer.
    ``recorded_sof`` / ``recorded_eof`` are the timestamps a replayed frame had when it was
    recorded (``None`` for a live frame); ``timestamp_sof`` / ``timestamp_eof`` are always on the
    clock of the service that receives it.
    """

    buffer: Buffer = field(repr=False)
    width: int
    height: int
    stride: int
    frame_id: int
    timestamp_sof: int
    timestamp_eof: int
    recorded_sof: int | None = None
    recorded_eof: int | None = None
    layout: Nv12Layout = field(init=False, repr=False)

    def __post_init__(self) -> None:
        frame_id = _as_int(self.frame_id, "frame_id")
        if frame_id < 0:
            raise FrameError(f"frame ids count up from 0, got {frame_id}")
        try:
            layout = nv12_layout(self.width, self.height)
        except FrameGeometryError as exc:
            raise FrameGeometryError(
                f"frame {frame_id}: {exc}", expected=exc.expected, observed=exc.observed
            ) from None
        _check_buffer(self.buffer, layout, f"frame {frame_id} ({layout.width}x{layout.height})")
        stride = _as_int(self.stride, "stride")
        if stride != layout.stride:
            raise FrameGeometryError(
                f"frame {frame_id}: stride {stride} does not match width {layout.width}: "
                f"expected {layout.stride} (the width aligned to 128)",
                expected=layout.stride,
                observed=stride,
            )
        sof = _as_int(self.timestamp_sof, "timestamp_sof")
        eof = _as_int(self.timestamp_eof, "timestamp_eof")
        if eof < sof:
            raise FrameError(
                f"frame {frame_id}: end of frame ({eof} ns) is before its start ({sof} ns)"
            )
        values = dict(frame_id=frame_id, width=layout.width, height=layout.height, stride=stride)
        values.update(timestamp_sof=sof, timestamp_eof=eof)
        for name in ("recorded_sof", "recorded_eof"):
            recorded = getattr(self, name)
            if recorded is not None:
                values[name] = _as_int(recorded, name)
        for name, value in values.items():
            object.__setattr__(self, name, value)
        object.__setattr__(self, "layout", layout)

    @property
    def size(self) -> tuple[int, int]:
        """(width, height)."""
        return (self.width, self.height)

    @property
    def y(self) -> Buffer:
        """The luma plane, ``height`` x ``width`` (a view; rows are ``stride`` apart)."""
        rows = self.buffer[: self.height * self.stride].reshape(self.height, self.stride)
        return rows[:, : self.width]

    @property
    def uv(self) -> Buffer:
        """The chroma plane, ``height / 2`` x ``width`` bytes of interleaved U,V (a view).

        ``frame.uv[:, 0::2]`` is U, ``frame.uv[:, 1::2]`` is V, each ``height / 2`` x ``width / 2``.
        """
        start = self.layout.uv_offset
        rows = self.height // 2
        plane = self.buffer[start : start + rows * self.stride].reshape(rows, self.stride)
        return plane[:, : self.width]

    def retimed(self, timestamp_sof: int, timestamp_eof: int) -> Frame:
        """This frame (same buffer) stamped on another clock, keeping the timestamps it had as
        ``recorded_sof`` / ``recorded_eof`` (unless it already carries recorded ones)."""
        return dataclasses.replace(
            self,
            timestamp_sof=timestamp_sof,
            timestamp_eof=timestamp_eof,
            recorded_sof=self.timestamp_sof if self.recorded_sof is None else self.recorded_sof,
            recorded_eof=self.timestamp_eof if self.recorded_eof is None else self.recorded_eof,
        )

    @classmethod
    def from_planes(
        cls,
        y: npt.ArrayLike,
        uv: npt.ArrayLike,
        *,
        frame_id: int,
        timestamp_sof: int,
        timestamp_eof: int,
    ) -> Frame:
        """A frame holding copies of a ``height`` x ``width`` luma plane and a ``height / 2`` x
        ``width`` interleaved chroma plane, in camerad's layout (padding bytes are 0)."""
        y_plane = np.asarray(y)
        uv_plane = np.asarray(uv)
        if y_plane.ndim != 2:
            raise FrameGeometryError(
                f"the luma plane must be 2-D (height x width), got shape {y_plane.shape}",
                expected="(height, width)",
                observed=y_plane.shape,
            )
        height, width = y_plane.shape
        layout = nv12_layout(width, height)
        if uv_plane.shape != (height // 2, width):
            raise FrameGeometryError(
                f"the chroma plane of a {width}x{height} frame must be {height // 2}x{width} "
                f"(interleaved U,V), got shape {uv_plane.shape}",
                expected=(height // 2, width),
                observed=uv_plane.shape,
            )
        buffer = np.zeros(layout.size, dtype=np.uint8)
        frame = cls(
            buffer,
            width,
            height,
            layout.stride,
            frame_id=frame_id,
            timestamp_sof=timestamp_sof,
            timestamp_eof=timestamp_eof,
        )
        frame.y[...] = y_plane
        frame.uv[...] = uv_plane
        return frame
