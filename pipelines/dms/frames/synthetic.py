"""The synthetic sources: a cabin camera with a moving scene, and the calibration stream beside it
(openpilot's ``liveCalibration``), both paced on the loop clock (see
:mod:`pipelines.dms.frames.source`), with drops, jitter, a resolution change and stale or
non-finite calibration on request.

The camera's scene is built once per geometry and process, on a worker thread (a few hundred
milliseconds of numpy, which the event loop does not wait through): in a test under
:func:`~aio_runtime.testing.virtual_time`, ``await camera.open()`` first, or hold the clock for
it (``hold=threads_busy()``, asyncio).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Collection, Mapping

import numpy as np
import numpy.typing as npt

from aio_runtime import CameraTimeout, run_in_thread

from .frame import AR_OX_FISHEYE, CameraConfig, Frame, camera_by_name, nv12_layout, other_camera
from .source import (
    CalibrationSample,
    ClosableStream,
    Rpy,
    SourceBase,
    clock_ns,
    period_ns,
    wait_until_ns,
)

__all__ = ["SCENE_TIMEOUT", "SyntheticCalibration", "SyntheticCamera"]

Buffer = npt.NDArray[np.uint8]


def _camera(camera: CameraConfig | str) -> CameraConfig:
    return camera_by_name(camera) if isinstance(camera, str) else camera


def _count(value: int | None, what: str) -> int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise ValueError(f"{what} must be a non-negative integer or None, got {value!r}")
    return value


# --- the synthetic camera -------------------------------------------------------------------

_SCROLL_ROWS = 64  # vertical travel of the scene, rows
_ROWS_PER_FRAME = 2
_COLUMNS_PER_FRAME = 4


def _triangle(step: int, span: int) -> int:
    """0, 1, ..., span, span - 1, ..., 0, ...: a back-and-forth position."""
    if span <= 0:
        return 0
    phase = step % (2 * span)
    return phase if phase <= span else 2 * span - phase


class _Scene:
    """A precomputed scene for one geometry; a frame is one contiguous copy out of it.

    The luma "tape" has rows ``stride`` bytes long, so a window starting at row ``r``, column
    ``c`` (with ``c + width <= stride``) is a contiguous slice that is exactly a Y plane with that
    stride: moving the window moves the scene, at the cost of one memcpy. The chroma plane and the
    padding after it are fixed (padding 0).
    """

    def __init__(self, camera: CameraConfig) -> None:
        layout = nv12_layout(camera.width, camera.height)
        self.layout = layout
        self.columns = layout.stride - layout.width  # horizontal travel
        rows = layout.y_height + _SCROLL_ROWS + 1
        y, x = np.mgrid[0:rows, 0 : layout.stride].astype(np.float32)
        h, w = float(layout.height), float(layout.width)
        luma = 60.0 + 50.0 * (y / rows)  # a lit-from-above cabin
        luma += 12.0 * (((x // 32) + (y // 32)) % 2)  # texture, so motion is visible anywhere
        face = ((x - w / 2) / (0.13 * w)) ** 2 + ((y - h / 2) / (0.22 * h)) ** 2 < 1.0
        luma[face] = 170.0
        for side in (-1.0, 1.0):  # two dark eyes
            eye = ((x - w / 2 - side * 0.05 * w) / (0.02 * w)) ** 2 + (
                (y - 0.45 * h) / (0.012 * w)
            ) ** 2 < 1.0
            luma[eye] = 30.0
        self.tape = np.clip(luma, 16, 235).astype(np.uint8).ravel()
        self.tape.flags.writeable = False
        tail = np.zeros(layout.size - layout.uv_offset, dtype=np.uint8)
        uv = tail[: (layout.height // 2) * layout.stride].reshape(-1, layout.stride)
        uv[:, : layout.width : 2] = 118  # U: a faint warm tint
        uv[:, 1 : layout.width : 2] = 140  # V
        tail.flags.writeable = False
        self.tail = tail

    def render(self, step: int, buffer: Buffer) -> Buffer:
        layout = self.layout
        start = _triangle(step * _ROWS_PER_FRAME, _SCROLL_ROWS) * layout.stride + _triangle(
            step * _COLUMNS_PER_FRAME, self.columns
        )
        buffer[: layout.uv_offset] = self.tape[start : start + layout.uv_offset]
        buffer[layout.uv_offset :] = self.tail
        return buffer


class _Buffers:
    """Frame buffers of one size. A buffer is used again for a new frame once nothing refers to it
    (no frame, no view of it: a view refers to the buffer it views), so a frame is one copy into
    memory already mapped — a fresh 4.8 MB buffer costs its page faults too, milliseconds on a
    busy machine. At most ``keep`` buffers are kept; past that, frames get buffers of their
    own."""

    def __init__(self, size: int, keep: int = 8) -> None:
        self.size = size
        self.keep = keep
        self._kept: list[Buffer] = []

    def take(self) -> Buffer:
        for i in range(len(self._kept)):
            if sys.getrefcount(self._kept[i]) == 2:  # this list's reference and the call's own
                return self._kept[i]
        buffer = np.empty(self.size, dtype=np.uint8)
        if len(self._kept) < self.keep:
            self._kept.append(buffer)
        return buffer


SCENE_TIMEOUT = 10.0
"""Seconds the scenes of a camera's geometries may take to build (typically 0.1-0.4 s)."""

_scenes: dict[CameraConfig, _Scene] = {}
"""The scene of each geometry built so far in this process, shared (read-only)."""


def _build_scenes(cameras: Collection[CameraConfig]) -> None:
    for camera in cameras:
        if camera not in _scenes:
            _scenes[camera] = _Scene(camera)


class SyntheticCamera(SourceBase):
    """A cabin camera made of numbers: frames with camerad's ids and timestamps, and a moving scene.

    * ``camera`` — geometry and readout time (default ``ar_ox_fisheye``, 1928x1208), at ``fps``
      (default 20 Hz).
    * ``frames`` — deliver this many frames, then end (default: never end).
    * ``jitter`` — seconds; each start of frame lands uniformly within ± ``jitter`` of its nominal
      instant (reproducible from ``seed``; less than half a period, so frames stay in order).
    * ``drop`` — frame ids camerad does not publish: their period passes, their id is skipped.
    * ``switch_at`` — from this frame id on, frames have ``switch_to``'s geometry (default: the
      other cabin camera's), as when a stream restarts at another resolution.

    The scene of each geometry it will need is built on a worker thread by :meth:`open`, or by the
    first frame (:class:`~aio_runtime.CameraTimeout` past :data:`SCENE_TIMEOUT`), whose capture
    period starts after that. Making a frame then costs one copy of the buffer (≈0.3 ms for
    1928x1208), into a buffer of an earlier frame that nothing refers to any more, if there is
    one: a frame is never changed while anything holds it or a view of it.
    """

    def __init__(
        self,
        camera: CameraConfig | str = AR_OX_FISHEYE,
        *,
        fps: float | None = None,
        frames: int | None = None,
        jitter: float = 0.0,
        seed: int = 0,
        drop: Collection[int] = (),
        switch_at: int | None = None,
        switch_to: CameraConfig | str | None = None,
    ) -> None:
        self.camera = _camera(camera)
        self.fps = self.camera.fps if fps is None else fps
        self.period_ns = period_ns(self.fps)
        if not (math.isfinite(jitter) and 0 <= jitter * 1e9 < self.period_ns / 2):
            raise ValueError(
                f"jitter must be >= 0 and under half a period ({self.period_ns / 2e9:.4f} s), "
                f"got {jitter!r}"
            )
        self.jitter_ns = round(jitter * 1e9)
        self.frames = _count(frames, "frames")
        self.drop = frozenset(drop)
        self.switch_at = _count(switch_at, "switch_at")
        self.switch_to = other_camera(self.camera) if switch_to is None else _camera(switch_to)
        self._rng = np.random.default_rng(seed)
        self._buffers: dict[CameraConfig, _Buffers] = {}
        self._origin_ns: int | None = None
        self._next_id = 0
        self.dropped = 0
        """Frame ids skipped so far (``drop``)."""

    async def open(self) -> None:
        """Build the scene of each geometry the camera will need (on a worker thread, bounded by
        :data:`SCENE_TIMEOUT`), unless this process has built it already: the first frame does
        it otherwise, before its capture period starts."""
        cameras = [self.camera] if self.switch_at is None else [self.camera, self.switch_to]
        missing = [camera for camera in cameras if camera not in _scenes]
        if missing:
            names = " and ".join(f"{c.width}x{c.height}" for c in missing)
            await run_in_thread(
                lambda: _build_scenes(missing),
                awaited=f"the synthetic camera's scene ({names})",
                error=CameraTimeout,
                timeout=SCENE_TIMEOUT,
            )

    def camera_at(self, frame_id: int) -> CameraConfig:
        """The geometry of frame ``frame_id``."""
        if self.switch_at is not None and frame_id >= self.switch_at:
            return self.switch_to
        return self.camera

    def _jitter(self) -> int:
        if not self.jitter_ns:
            return 0
        return int(self._rng.integers(-self.jitter_ns, self.jitter_ns, endpoint=True))

    def _next_capture(self) -> tuple[int, int]:
        """The next published frame id and its jitter, skipping dropped ids."""
        while self._next_id in self.drop:
            self._next_id += 1
            self.dropped += 1
            self._jitter()  # a dropped period still draws, so jitter does not depend on drops
        self._next_id += 1
        return self._next_id - 1, self._jitter()

    async def _next_frame(self) -> Frame:
        if self.frames is not None and self.delivered >= self.frames:
            raise StopAsyncIteration
        if self._origin_ns is None:
            await self.open()  # before the first frame is due
            self._origin_ns = clock_ns()
        frame_id, jitter = self._next_capture()
        camera = self.camera_at(frame_id)
        sof = self._origin_ns + frame_id * self.period_ns + jitter
        scene = _scenes[camera]
        buffers = self._buffers.setdefault(camera, _Buffers(scene.layout.size))
        return Frame(
            scene.render(frame_id, buffers.take()),
            camera.width,
            camera.height,
            nv12_layout(camera.width, camera.height).stride,
            frame_id=frame_id,
            timestamp_sof=sof,
            timestamp_eof=sof + camera.readout_ns,
        )


# --- the synthetic calibration stream -------------------------------------------------------


class SyntheticCalibration(ClosableStream):
    """A ``liveCalibration`` stream: one :class:`CalibrationSample` per period (default 4 Hz).

    Sample ``k`` is due ``k`` periods after the first is requested. ``rpy`` is the value published;
    ``overrides`` replaces it for given samples and ``nan_at`` makes given samples all NaN. Samples
    in ``missing``, and every sample from ``silent_after`` on, are not published (the stream goes
    stale; it keeps its pace and ends only after ``count`` periods, if given).
    """

    def __init__(
        self,
        rpy: Rpy = (0.0, 0.0, 0.0),
        *,
        rate: float = 4.0,
        count: int | None = None,
        missing: Collection[int] = (),
        nan_at: Collection[int] = (),
        overrides: Mapping[int, Rpy] | None = None,
        silent_after: int | None = None,
    ) -> None:
        self.rpy = _rpy(rpy)
        self.period_ns = period_ns(rate, "rate")
        self.count = _count(count, "count")
        self.missing = frozenset(missing)
        self.silent_after = _count(silent_after, "silent_after")
        self.overrides = {k: _rpy(v) for k, v in (overrides or {}).items()}
        nan = (math.nan, math.nan, math.nan)
        self.overrides.update({k: nan for k in nan_at})
        self._origin_ns: int | None = None
        self._next = 0

    def _published(self, seq: int) -> bool:
        silent = self.silent_after is not None and seq >= self.silent_after
        return not silent and seq not in self.missing

    async def __anext__(self) -> CalibrationSample:
        if self._origin_ns is None:
            self._origin_ns = clock_ns()
        while not self._closed and (self.count is None or self._next < self.count):
            seq = self._next
            due = self._origin_ns + seq * self.period_ns
            await wait_until_ns(due)
            self._next += 1  # only now: a consumer cancelled while waiting gets this sample next
            if self._published(seq):
                return CalibrationSample(seq, self.overrides.get(seq, self.rpy), due)
        raise StopAsyncIteration


def _rpy(value: Rpy) -> Rpy:
    if len(value) != 3:
        raise ValueError(f"a calibration is (roll, pitch, yaw), got {len(value)} values")
    roll, pitch, yaw = (float(v) for v in value)
    return (roll, pitch, yaw)
