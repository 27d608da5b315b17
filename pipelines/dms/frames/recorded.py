"""Sources of recorded frames — a recording, a video file, an openpilot route segment — as a live
camera delivers its frames: read ahead on the source's worker thread, and, paced, each handed on at
its recorded end of frame on the loop clock (design C13: a recorded input pays what a live camera
pays), a frame the source could only deliver stale skipped.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, cast

from aio_runtime import (
    CameraTimeout,
    Completion,
    Layer,
    Ledger,
    LedgerEntry,
    LedgerKind,
    PendingCall,
    current_ledger,
    wait_complete,
)

from ..config.settings import STALE_AFTER
from .frame import Frame
from .source import RecordedTime, SourceBase, clock_ns, wait_until_ns

__all__ = ["AHEAD", "GiveWay", "RecordedSource"]

AHEAD = 2
"""Frames a recorded source reads (decodes) ahead of the one it delivers next."""


class GiveWay:
    """Work that a recorded source's reads give way to. While it is held (from any thread), a
    read waits on the source's worker thread, before it starts, until nothing holds it — at most
    the source's staleness bound. On a host without the CPU for both, a frame read already is
    worth more than the next one read: the service's model holds it while it runs, overloaded
    (a read already under way is not stopped)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._holders = 0
        self._free = threading.Event()
        self._free.set()

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """Reads that have not started wait inside the block."""
        with self._lock:
            self._holders += 1
            self._free.clear()
        try:
            yield
        finally:
            with self._lock:
                self._holders -= 1
                if not self._holders:
                    self._free.set()

    def wait(self, timeout: float) -> bool:
        """Until nothing holds it, at most ``timeout`` seconds: whether nothing does."""
        return self._free.wait(timeout)


@dataclass
class _Read:
    """A call handed to a recorded source's worker thread: a frame's read, or a skip ahead."""

    call: PendingCall
    done: Completion[Any]
    ledger: Ledger
    entry: LedgerEntry
    took: list[float]
    """How long the call took on the worker thread, once done."""
    skip: bool = False


class RecordedSource(SourceBase):
    """The shared shell of a source of recorded frames — a recording, a video file, a route
    segment: frames read on the source's worker thread and delivered as a live camera delivers
    its own.

    A subclass reads its next frame in :meth:`_read_recorded`, on the worker thread, with the
    timestamps it was recorded with (None at the end); it may skip frames without reading them
    in :meth:`_skip_recorded`. Frames are **read ahead**: up to :attr:`ahead` reads wait on the
    worker thread behind the frame being delivered (each frame's buffer held until it is
    delivered: ``ahead`` + 1 frames at most, 11 MB at 1928x1208), so that a frame is ready before
    it is due, as camerad hands on a frame it has read out, and its reading is not charged to
    its age. Each frame is moved onto the loop clock (:class:`RecordedTime`); paced, it is
    delivered at its end of frame there.

    A paced source that falls behind — a frame ready only :attr:`stale_after` past its end of
    frame — skips it (counted in :attr:`skipped`), as a live camera's consumer finds old frames
    gone. Where its reads are quicker than the frames' spacing it catches up by reading on;
    where they are not, it must skip ahead unread to the frame due (:meth:`_skip_recorded`: a
    recording by its headers, HEVC to its next keyframe); and where it cannot (no keyframe
    ahead), it hands on the frame it has, stale, once it has handed on none for
    :attr:`stale_after`: its consumer hears of frames, stale ones, rather than silence.
    Replaying (unpaced), nothing is skipped.
    """

    ahead: int = AHEAD
    stale_after: float = STALE_AFTER
    """Seconds past its end of frame at which a frame is skipped (paced only; the service sets
    its own staleness bound)."""
    skipped: int = 0
    """Frames not delivered because the source fell behind (paced only)."""
    falling_behind: bool = False
    """It skipped a frame, and has handed none on in time since."""
    read_timeout: float = 2.0
    """Seconds to wait for a frame's read once it is the one asked for."""
    gives_way: GiveWay | None = None
    """What its reads give way to (none by default; the service sets its own)."""
    _clock: RecordedTime
    _reads: deque[_Read]
    _ended: bool = False
    _behind: bool = False
    """A skip ahead is on its way to the worker thread."""
    _cannot_skip: bool = False
    """The last skip ahead found nothing to skip to."""
    _read_seconds: float = 0.0
    """Recent reads' time on the worker thread (a moving average)."""
    _spacing_ns: int = 0
    """The recorded spacing of the last two frames read."""
    _handed_at: int | None = None
    """When a frame was last handed on (loop clock, ns)."""
    _last_recorded: int | None = None
    _reading = "reading"
    """What a read does, for its bound's errors (``decoding`` a video's)."""

    def __init__(self, *, paced: bool) -> None:
        self.paced = paced
        self._clock = RecordedTime(paced=paced)
        self._reads = deque()
        self._where = type(self).__name__
        """What the source reads, for its errors."""

    async def open(self) -> object:
        """Open the source (on its worker thread); done by the first frame request if not
        before."""
        raise NotImplementedError

    def _read_recorded(self) -> Frame | None:
        """On the worker thread: the next frame, stamped as recorded; None at the end (and at
        every call after it)."""
        raise NotImplementedError

    def _skip_recorded(self, recorded_sof: int) -> int:
        """On the worker thread: skip, without reading them where the source can, frames
        recorded before ``recorded_sof`` that the next reads would return; how many. By
        default none: they are read, and skipped as they come."""
        return 0

    async def __anext__(self) -> Frame:
        stale_ns = round(self.stale_after * 1e9)
        while True:
            if self._closed:
                raise StopAsyncIteration
            frame = self._pending
            if frame is None:
                recorded = await self._next_recorded()
                if recorded is None:
                    await self.aclose()
                    raise StopAsyncIteration
                frame = self._pending = self._clock.retimed(recorded)
            if self.paced:
                late = clock_ns() - frame.timestamp_eof > stale_ns
                if late and not self._silent(stale_ns):
                    self._pending = None  # behind: gone, as a camera's would be
                    self._fell_behind(frame)
                    continue
                await wait_until_ns(frame.timestamp_eof)
                self.falling_behind = late  # a skip ahead waits for its frame: behind till then
            self._pending = None
            self.delivered += 1
            self._handed_at = clock_ns()
            return frame

    @property
    def ready_ahead(self) -> int:
        """Frames read and waiting to be handed on, the one due next among them."""
        return sum(1 for read in self._reads if not read.skip and read.done.done())

    def _silent(self, stale_ns: int) -> bool:
        """A source that cannot catch up nor skip ahead has handed on nothing for ``stale_ns``:
        it hands on what it has."""
        handed = self._handed_at
        return self._cannot_skip and handed is not None and clock_ns() - handed >= stale_ns

    async def _next_recorded(self) -> Frame | None:
        """The next frame read, reads ahead handed to the worker first."""
        await self.open()
        while True:
            for _ in range(0 if self._ended else self.ahead + 1 - len(self._reads)):
                self._hand(self._read_recorded, f"{self._reading} a frame of {self._where}")
            read = self._reads[0]
            result = await wait_complete(
                read.done,
                awaited=f"{self._reading} a frame of {self._where}",
                error=CameraTimeout,
                layer=Layer.CAMERA,
                timeout=self.read_timeout,
            )
            self._reads.popleft()
            if read.skip:
                self.skipped += result
                self._behind, self._cannot_skip = False, result == 0
                continue
            self._read_seconds += 0.2 * (sum(read.took) - self._read_seconds)
            if result is not None:
                frame = cast("Frame", result)
                if self._last_recorded is not None:
                    self._spacing_ns = frame.timestamp_sof - self._last_recorded
                self._last_recorded = frame.timestamp_sof
            if result is None:  # the end: the reads behind it have nothing to read
                self._ended = True
                self._withdraw()
            return cast("Frame | None", result)

    def _fell_behind(self, frame: Frame) -> None:
        """``frame`` is too old to deliver: skipped; a source whose reads are too slow to catch
        up skips ahead to the frame due now, one skip at a time."""
        self.skipped += 1
        self.falling_behind = True
        catches_up = self._read_seconds * 1e9 < 0.8 * self._spacing_ns
        if catches_up or self._behind or self._ended or frame.recorded_sof is None:
            return
        self._behind = True
        due = frame.recorded_sof + clock_ns() - frame.timestamp_sof
        self._hand(lambda: self._skip_recorded(due), f"skipping ahead in {self._where}", skip=True)

    def _hand(self, call: Callable[[], object], awaited: str, *, skip: bool = False) -> None:
        """Hand ``call`` to the worker thread, not waited for: its outcome waits in
        :attr:`_reads`, its call in the ledger until it returns (or is withdrawn)."""
        done: Completion[Any] = Completion()
        setter = done.threadsafe_setter()
        context = contextvars.copy_context()
        ledger = current_ledger()
        entry = ledger.open(LedgerKind.WORKER_THREAD, awaited)
        took: list[float] = []
        gives_way, bound = (None if skip else self.gives_way), self.stale_after

        def work() -> None:
            if gives_way is not None:
                gives_way.wait(bound)
            start = time.perf_counter()
            try:
                result = context.run(call)
            except BaseException as exc:  # handed to whoever waits for it
                took.append(time.perf_counter() - start)
                ledger.close(entry)
                setter.set_exception(exc)
            else:
                took.append(time.perf_counter() - start)
                ledger.close(entry)
                setter.set_result(result)

        pending = self._worker_thread().submit(work)
        self._reads.append(_Read(pending, done, ledger, entry, took, skip))

    def _withdraw(self) -> None:
        """Take back the reads that have not started (they never run)."""
        kept: deque[_Read] = deque()
        for read in self._reads:
            if read.call.withdraw():
                read.ledger.close(read.entry)
            else:
                kept.append(read)
        self._reads = kept

    def _end_worker(self) -> None:
        self._withdraw()
        super()._end_worker()
