"""Camera sources: what a source is, how it keeps time, and the synthetic ones.

Every source is a :class:`FrameSource`: an async iterator of :class:`~pipelines.dms.camera.Frame`
with ``aclose()``. Sources pace on the running event loop's clock (:func:`wait_until_ns`), so they
run in real time in a service and deterministically, in milliseconds, under
:func:`aio_runtime.testing.virtual_time`. Here: :class:`SyntheticCamera` and the calibration
stream beside it, :class:`SyntheticCalibration`. The video-file source is in
:mod:`pipelines.dms.camera_video`, recorded replay in :mod:`pipelines.dms.camera_replay`.

Timing, as camerad produces it (spec section 5): capture period ``k`` starts at
``origin + k * period`` (plus jitter, if asked for), where ``origin`` is the loop clock when the
first frame is requested; its frame has ``frame_id = k``, ``timestamp_sof`` = that start and
``timestamp_eof`` = start + the sensor's readout time (integer ns), and it is delivered at its end
of frame. A dropped frame is never delivered and its id is skipped. A consumer that asks late gets
the frame at once, with its capture-time stamps: a late consumer sees old frames, not a camera that
slows down.
"""

from __future__ import annotations

import functools
import math
from collections.abc import AsyncIterator, Callable, Collection, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Protocol, Self, TypeVar, runtime_checkable

import anyio
import numpy as np
import numpy.typing as npt

from aio_runtime import CameraTimeout, Layer, WorkerThread, now, run_in_thread

from .camera import (
    AR_OX_FISHEYE,
    CameraConfig,
    Frame,
    camera_by_name,
    nv12_layout,
    other_camera,
)

__all__ = [
    "CalibrationSample",
    "FrameSource",
    "Rpy",
    "SourceBase",
    "SyntheticCalibration",
    "SyntheticCamera",
    "clock_ns",
    "period_ns",
    "wait_until_ns",
]

Buffer = npt.NDArray[np.uint8]
Rpy = tuple[float, float, float]
"""(roll, pitch, yaw) in radians."""


def _camera(camera: CameraConfig | str) -> CameraConfig:
    return camera_by_name(camera) if isinstance(camera, str) else camera


def period_ns(fps: float, what: str = "fps") -> int:
    """The period of a ``fps`` Hz rate in integer ns; rejects a rate that is not positive and finite."""
    if not (isinstance(fps, (int, float)) and math.isfinite(fps) and fps > 0):
        raise ValueError(f"{what} must be a positive, finite rate in Hz, got {fps!r}")
    return round(1e9 / fps)


def _count(value: int | None, what: str) -> int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise ValueError(f"{what} must be a non-negative integer or None, got {value!r}")
    return value


# --- what every source is ------------------------------------------------------------------


@runtime_checkable
class FrameSource(Protocol):
    """What every camera source is: an async iterator of frames that can be closed.

    ``aclose()`` releases what the source holds (a decoder, a file); afterwards iteration ends.
    Sources are also async context managers that close on exit.
    """

    def __aiter__(self) -> AsyncIterator[Frame]: ...

    async def __anext__(self) -> Frame: ...

    async def aclose(self) -> None: ...


T = TypeVar("T")


class _Stream:
    """An async iterator of its own that can be closed, also with ``async with``."""

    _closed: bool = False

    def __aiter__(self) -> Self:
        return self

    async def aclose(self) -> None:
        self._closed = True

    @property
    def closed(self) -> bool:
        return self._closed

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


class SourceBase(_Stream):
    """The shared shell of a source: iteration, delivery at end of frame, closing.

    A subclass makes its next frame in :meth:`_next_frame` (raising ``StopAsyncIteration`` at the
    end); the frame is delivered at its ``timestamp_eof`` on the loop clock. A consumer cancelled
    while it waits (a ``move_on_after`` around ``anext``) loses nothing: the same frame is
    delivered by the next request. A source reading a file does its blocking calls with
    :meth:`_blocking`, on one worker thread of its own (not a thread started per frame).
    """

    _pending: Frame | None = None
    _worker: WorkerThread | None = None
    delivered: int = 0
    """Frames handed out so far."""

    async def __anext__(self) -> Frame:
        if self._closed:
            raise StopAsyncIteration
        frame = self._pending
        if frame is None:
            frame = self._pending = await self._next_frame()
        await wait_until_ns(frame.timestamp_eof)
        self._pending = None
        self.delivered += 1
        return frame

    async def _next_frame(self) -> Frame:
        raise NotImplementedError

    async def _blocking(self, call: Callable[[], T], *, awaited: str, timeout: float) -> T:
        """``call()`` on the source's worker thread, bounded by ``timeout``
        (:class:`~aio_runtime.CameraTimeout`)."""
        if self._worker is None:
            self._worker = WorkerThread(f"camera {type(self).__name__}")
        return await run_in_thread(
            call,
            awaited=awaited,
            error=CameraTimeout,
            layer=Layer.CAMERA,
            timeout=timeout,
            worker=self._worker,
        )

    def _end_worker(self) -> None:
        """Let the worker thread end (once the calls handed to it have run)."""
        worker, self._worker = self._worker, None
        if worker is not None:
            worker.close()


def clock_ns() -> int:
    """The running loop's clock (:func:`aio_runtime.now`) in integer nanoseconds: the clock our
    frame timestamps are on."""
    return round(now() * 1e9)


async def wait_until_ns(t_ns: int) -> None:
    """Wait until ``t_ns`` on the loop clock: how a camera source paces its frames.

    A camera is a clock-driven producer: a frame exists only once its capture period has passed.
    This is the one place camera code sleeps (the architecture test allows it here and only here).
    It is no hardware wait and needs no timeout: the instant is known and always reached.
    """
    await anyio.sleep_until(t_ns / 1e9)


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

    def render(self, step: int) -> Buffer:
        layout = self.layout
        start = _triangle(step * _ROWS_PER_FRAME, _SCROLL_ROWS) * layout.stride + _triangle(
            step * _COLUMNS_PER_FRAME, self.columns
        )
        buffer = np.empty(layout.size, dtype=np.uint8)
        buffer[: layout.uv_offset] = self.tape[start : start + layout.uv_offset]
        buffer[layout.uv_offset :] = self.tail
        return buffer


@functools.cache
def _scene(camera: CameraConfig) -> _Scene:
    """The scene of a geometry, built once per process (≈0.1 s) and shared (read-only)."""
    return _Scene(camera)


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

    Making a frame costs one copy of the buffer (≈0.3 ms for 1928x1208).
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
        _scene(self.camera)  # precompute before the first frame is due
        if self.switch_at is not None:
            _scene(self.switch_to)
        self._origin_ns: int | None = None
        self._next_id = 0
        self.dropped = 0
        """Frame ids skipped so far (``drop``)."""

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
            self._origin_ns = clock_ns()
        frame_id, jitter = self._next_capture()
        camera = self.camera_at(frame_id)
        sof = self._origin_ns + frame_id * self.period_ns + jitter
        return Frame(
            _scene(camera).render(frame_id),
            camera.width,
            camera.height,
            nv12_layout(camera.width, camera.height).stride,
            frame_id=frame_id,
            timestamp_sof=sof,
            timestamp_eof=sof + camera.readout_ns,
        )


# --- the synthetic calibration stream -------------------------------------------------------


@dataclass(frozen=True)
class CalibrationSample:
    """One calibration message: ``rpy`` = (roll, pitch, yaw) in radians (openpilot's
    ``liveCalibration.rpyCalib``), stamped at ``timestamp_ns`` on the loop clock; ``seq`` counts
    publication periods from 0 (a missing message leaves a gap)."""

    seq: int
    rpy: Rpy
    timestamp_ns: int

    @property
    def finite(self) -> bool:
        return all(math.isfinite(v) for v in self.rpy)


class SyntheticCalibration(_Stream):
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
