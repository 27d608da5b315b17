"""Camera sources: what a source is and how it keeps time.

Every source is a :class:`FrameSource`: an async iterator of :class:`~pipelines.dms.frames.frame.Frame`
with ``aclose()``. Sources pace on the running event loop's clock (:func:`wait_until_ns`), so they
run in real time in a service and deterministically, in milliseconds, under
:func:`aio_runtime.testing.virtual_time`. The synthetic camera and calibration stream are in
:mod:`pipelines.dms.frames.synthetic`; the sources of recorded frames share
:mod:`pipelines.dms.frames.recorded` (read ahead, delivered as a camera delivers): the video-file
source in :mod:`pipelines.dms.frames.video`, recorded replay in :mod:`pipelines.dms.frames.replay`,
openpilot's route segments in :mod:`pipelines.dms.frames.segment`;
:func:`pipelines.dms.frames.open_camera` opens the one a
:data:`~pipelines.dms.config.kinds.CameraSpec` names.

Timing, as camerad produces it (spec section 5): capture period ``k`` starts at
``origin + k * period`` (plus jitter, if asked for), where ``origin`` is the loop clock when the
first frame is requested; its frame has ``frame_id = k``, ``timestamp_sof`` = that start and
``timestamp_eof`` = start + the sensor's readout time (integer ns), and it is delivered at its end
of frame. A dropped frame is never delivered and its id is skipped. A consumer that asks late gets
the frame at once, with its capture-time stamps: a late consumer sees old frames, not a camera that
slows down.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import AsyncIterable, AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Protocol, Self, TypeVar, runtime_checkable

import anyio

from aio_runtime import AsyncResource, CameraTimeout, Layer, WorkerThread, now, run_in_thread

from .frame import Frame

__all__ = [
    "CLOSE_BOUND",
    "CalibrationSample",
    "ClosableStream",
    "FrameSource",
    "RecordedTime",
    "Rpy",
    "SourceBase",
    "clock_ns",
    "closing",
    "period_ns",
    "wait_until_ns",
]

Rpy = tuple[float, float, float]
"""(roll, pitch, yaw) in radians."""


def period_ns(fps: float, what: str = "fps") -> int:
    """The period of a ``fps`` Hz rate in integer ns; rejects a rate that is not positive and finite."""
    if not (isinstance(fps, (int, float)) and math.isfinite(fps) and fps > 0):
        raise ValueError(f"{what} must be a positive, finite rate in Hz, got {fps!r}")
    return round(1e9 / fps)


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


class ClosableStream(AsyncResource):
    """An async iterator of its own that can be closed, also with ``async with``."""

    _closed: bool = False

    def __aiter__(self) -> Self:
        return self

    async def aclose(self) -> None:
        self._closed = True

    @property
    def closed(self) -> bool:
        return self._closed


class SourceBase(ClosableStream):
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
    paced: bool = True
    """Delivered at each frame's end of frame (a camera's pace); unpaced (a file replayed as
    fast as it is asked for): at once, each frame stamped as it is read."""
    length: int | None = None
    """How many frames the source holds, where it knows (a file, once open)."""

    async def __anext__(self) -> Frame:
        if self._closed:
            raise StopAsyncIteration
        frame = self._pending
        if frame is None:
            frame = self._pending = await self._next_frame()
        if self.paced:
            await wait_until_ns(frame.timestamp_eof)
        self._pending = None
        self.delivered += 1
        return frame

    async def _next_frame(self) -> Frame:
        raise NotImplementedError

    async def _blocking(self, call: Callable[[], T], *, awaited: str, timeout: float) -> T:
        """``call()`` on the source's worker thread, bounded by ``timeout``
        (:class:`~aio_runtime.CameraTimeout`)."""
        return await run_in_thread(
            call,
            awaited=awaited,
            error=CameraTimeout,
            layer=Layer.CAMERA,
            timeout=timeout,
            worker=self._worker_thread(),
        )

    def _worker_thread(self) -> WorkerThread:
        if self._worker is None:
            self._worker = WorkerThread(f"camera {type(self).__name__}")
        return self._worker

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


class RecordedTime:
    """How a replayed source moves frames stamped on another clock (a recording's, a log's) onto
    the loop clock.

    Paced: the first frame's start of frame is the moment it is retimed, and later frames keep
    their recorded spacing from it (so each is delivered at its recorded interval); unpaced:
    each frame is stamped as it is retimed. Either way a frame keeps its readout (end minus
    start of frame), and its recorded timestamps stay on it as ``recorded_sof`` /
    ``recorded_eof`` (:meth:`~pipelines.dms.frames.frame.Frame.retimed`).
    """

    def __init__(self, *, paced: bool) -> None:
        self.paced = paced
        self._origin: tuple[int, int] | None = None
        """(loop clock, recorded start of frame) of the first frame retimed."""

    def retimed(self, frame: Frame) -> Frame:
        """``frame`` on the loop clock (the same buffer)."""
        if not self.paced:
            sof = clock_ns()
        else:
            if self._origin is None:
                self._origin = (clock_ns(), frame.timestamp_sof)
            sof = self._origin[0] + frame.timestamp_sof - self._origin[1]
        return frame.retimed(sof, sof + frame.timestamp_eof - frame.timestamp_sof)


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


CLOSE_BOUND = 5.0
"""Seconds a source's close may take once the run is ending (the kit's sources bound their own
closes within it; a caller's source that does not is left behind after it)."""


@contextlib.asynccontextmanager
async def closing(source: AsyncIterable[Any]) -> AsyncIterator[None]:
    """Close ``source`` when the block ends, if it can be closed; leave a plain iterable be.
    However the block ends — the stream's end, a limit reached or the run stopped — the close
    runs shielded from cancellation, so what the source holds is released, within
    :data:`CLOSE_BOUND`."""
    try:
        yield
    finally:
        if isinstance(source, _Closable):
            with anyio.CancelScope(shield=True), anyio.move_on_after(CLOSE_BOUND):
                await source.aclose()


@runtime_checkable
class _Closable(Protocol):
    async def aclose(self) -> None: ...
