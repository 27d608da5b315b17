"""The camera stage: frames from the source into the service, numbered, counted and given their
deadlines, until the source ends or the limits are reached; and the camera's watchdog, which makes
a camera that stops delivering an UNAVAILABLE service that says so on every sink.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterable, Awaitable, Callable
from typing import Protocol, runtime_checkable

import anyio

from aio_runtime import CameraTimeout, get_logger, now, wait_complete

from ..config.kinds import CameraFile, CameraSpec, Mode, Synthetic
from ..frames import open_camera
from ..frames.frame import Frame
from ..frames.recorded import GiveWay, RecordedSource
from ..frames.source import closing
from ._faults import ServiceFaults
from ._job import UNBUDGETED, FrameJob, JobSlot
from ._outcomes import FrameOutcomes
from ._policy import FramePolicy

__all__ = ["Camera", "Limits"]

_log = get_logger(__name__)


class Limits(Protocol):
    """What bounds the camera's stream: each frame's budget and staleness bound (``no_budget``:
    neither), how many frames or seconds to take (None: no limit), and the mode (live: both start at each
    frame's start of frame; replaying: when the frame is handed on, and the stream waits for the
    stages and the sinks). A service config is one."""

    budget: float
    no_budget: bool
    frames: int | None
    duration: float | None
    mode: Mode

    @property
    def staleness(self) -> float: ...


@runtime_checkable
class _Openable(Protocol):
    """A source that opens before its first frame (bounded by its own timeouts)."""

    async def open(self) -> object: ...


class Camera:
    """Frames from ``source`` (a source, or the camera a spec names) into the service, numbered
    and counted, until the source ends or the ``limits`` are reached (frames, duration); each
    frame's deadline is its start of frame plus the ``limits``' budget, and its staleness bound
    its start of frame plus ``staleness`` (both :data:`UNBUDGETED` with ``no_budget``) —
    replaying, both start as the frame is handed on
    (:meth:`handed_on`). A source with an ``open()`` is opened first (the synthetic camera's
    scene, a file), which the watchdog does not count as a stall. A camera that cannot be
    opened, or fails, ends the stream, reported. The duration bounds the stream whatever the
    source does (a recording with a long gap, a file that stops delivering)."""

    def __init__(
        self,
        source: AsyncIterable[Frame] | CameraSpec,
        *,
        limits: Limits,
        faults: ServiceFaults,
        policy: FramePolicy,
        outcomes: FrameOutcomes,
    ) -> None:
        self.source = source
        self.gives_way = GiveWay()
        """What a recorded source's reads give way to (see :meth:`reads_behind`)."""
        self.budget = UNBUDGETED if limits.no_budget else limits.budget
        self.stale_after = UNBUDGETED if limits.no_budget else limits.staleness
        self.frames = limits.frames
        self.duration = limits.duration
        self.replay = limits.mode is Mode.REPLAY
        self.faults = faults
        self.policy = policy
        self.outcomes = outcomes
        self._arrived = anyio.Event()
        self._held = 0
        """Waits in progress on the stages or the sinks (replaying): not the camera's stall."""

    async def run(self, outbox: JobSlot) -> None:
        try:
            await self._frames(outbox)
        except Exception as exc:  # a source that fails ends the stream, reported, not a crash
            _log.error("camera failed", error=repr(exc))
            error = f"{type(exc).__name__}: {exc}"
            self.outcomes.camera_failed(error)
            self.policy.camera_failed(error)
        outbox.close()

    @property
    def length(self) -> int | None:
        """How many frames the source holds, where it says (a file, once open)."""
        return getattr(self.source, "length", None)

    def reads_behind(self) -> bool:
        """A paced recorded source has no frame read ahead of the one it hands on next: its
        reading (a video's decoding) is what holds the stream back. An overloaded service then
        leaves it the CPU rather than start a frame; and its reads give way to a model's run
        (:attr:`gives_way`). On a host that cannot do both for every frame, frames read and
        worked are worth more than frames read and dropped, and a run that has the CPU to itself
        ends before its frame is stale."""
        source = self.source
        return isinstance(source, RecordedSource) and source.paced and not source.ready_ahead

    async def _frames(self, outbox: JobSlot) -> None:
        source = self.source
        if isinstance(source, (Synthetic, CameraFile)):
            source = self.source = open_camera(source, paced=not self.replay)
        async with closing(source):
            # a scene to build, a file to open: not a stall (a plain open() is not ours to call)
            if isinstance(source, _Openable) and inspect.iscoroutinefunction(source.open):
                await self._held_by(source.open())
            with anyio.move_on_after(self.duration):  # None: no limit
                await self._take(source, outbox)

    async def _take(self, source: AsyncIterable[Frame], outbox: JobSlot) -> None:
        recorded = source if isinstance(source, RecordedSource) else None
        if recorded is None:
            await self._frames_of(source, outbox)
            return
        recorded.stale_after = self.stale_after
        recorded.gives_way = self.gives_way
        counted = recorded.skipped

        def count_skipped() -> None:  # the frames it skipped, having fallen behind: dropped
            nonlocal counted
            if recorded.skipped > counted:
                self.outcomes.skipped(recorded.skipped - counted)
                counted = recorded.skipped

        try:
            await self._frames_of(source, outbox, count_skipped)
        finally:
            count_skipped()

    async def _frames_of(
        self,
        source: AsyncIterable[Frame],
        outbox: JobSlot,
        arriving: Callable[[], None] = lambda: None,
    ) -> None:
        number = 0
        async for frame in source:
            arriving()
            if self.frames is not None and number >= self.frames:
                break
            self.faults.frame_arrives(number)
            if self.faults.camera_stalled(number):
                number += 1  # the camera delivers nothing while stalled
                continue
            self._arrived.set()
            start = frame.timestamp_sof / 1e9  # replaying, reset as it is handed on
            job = FrameJob(frame, number, start, start + self.budget, start + self.stale_after)
            self.outcomes.arrived(job)
            await self._held_by(outbox.send(job))
            if self.replay:
                await self._held_by(self.outcomes.room())
            number += 1

    def handed_on(self, job: FrameJob) -> None:
        """Replaying: the warp stage has taken the frame; its times start now."""
        job.start = now()
        job.deadline = job.start + self.budget
        job.stale_at = job.start + self.stale_after

    async def _held_by(self, wait: Awaitable[object]) -> None:
        """Wait on the stages or the sinks: time that is not the camera's."""
        self._held += 1
        try:
            await wait
        finally:
            self._held -= 1
            self._arrived.set()

    async def watch(self, stall_after: float) -> None:
        """A camera that stops delivering makes the service UNAVAILABLE, and says so on every
        sink each ``stall_after`` seconds while it lasts: it never goes silent. A recorded
        source that skipped frames meanwhile has not stopped: it falls behind, and the host is
        too slow to read it (overloaded, not a camera's stall)."""
        skipped = self._skipped()
        while True:
            try:
                await wait_complete(
                    self._arrived,
                    awaited="a camera frame",
                    error=CameraTimeout,
                    timeout=stall_after,
                )
                self._arrived = anyio.Event()
            except CameraTimeout as exc:  # reported again each period while the camera is out
                if not self._held:
                    behind = self._skipped() - skipped
                    if behind == 0 and self._falling_behind():
                        behind = -1  # behind still, catching up or skipping ahead
                    self.outcomes.status(self.policy.camera_stalled(exc, behind=behind))
            skipped = self._skipped()

    def _skipped(self) -> int:
        source = self.source
        return source.skipped if isinstance(source, RecordedSource) else 0

    def _falling_behind(self) -> bool:
        source = self.source
        return isinstance(source, RecordedSource) and source.falling_behind
