"""The compute queue's timeline: which value the next kernel signals, waiting for a value, the
kernels whose wait ended before their completion, and what a recovery does to them.

The GPU writes the timeline, a 32-bit value in its status page, with each kernel's RELEASE; the
host reads it (and the error word beside it) with register-sized reads, through a
:class:`aio_runtime.TimelineSignal` that compares as serial numbers. A device that reports its
error state ends a wait at the next read with :class:`~transports.errors.GpuFault`, and the
queue's readiness goes down.

Each read costs two requests over the bridge, so a wait reads the timeline once most of the time
recent kernels took has passed — three quarters of the shortest of the last few, or at once when
the wait's bound is nearer — and then every half millisecond (:data:`READ_INTERVAL`).

A kernel whose wait ends without its completion (a timeout, a cancelled task) *lingers*: its work
stays live in the session's :class:`~transports.gpu.deps.DependencyTracker`, so nothing reuses
its bytes, until the timeline shows it done (:meth:`ComputeTimeline.retire_finished`, or any
later wait) or a recovery resets the queue. Work that waits for a lingering kernel reads the
timeline itself (:meth:`ComputeTimeline.settle`).

Every recovery starts an *epoch*: kernels submitted before it that had not completed when it began
are lost, and their waits fail with ``GpuFault``.
"""

from __future__ import annotations

from collections import deque

import anyio

from aio_runtime import (
    Layer,
    PollPolicy,
    Readiness,
    ReadinessLayer,
    SignalTimeout,
    TimelineSignal,
    WaitBound,
    now,
    pause,
)

from ..bridge import BridgeClient
from ..errors import GpuFault
from ..protocol import gpu as hw
from .deps import DependencyTracker, Work

__all__ = ["ComputeTimeline"]

READ_INTERVAL = 0.0005
"""Seconds between reads of the timeline while a wait goes on (no spin: a kernel is not done
within microseconds of its submission)."""
_FIRST_READ = 0.75
"""The first read of a wait, as a fraction of the shortest time the recent kernels took."""
_RECENT = 8
"""How many recent kernels' times are kept."""


class ComputeTimeline:
    """The compute timeline of the GPU whose status page is at ``status``; lingering kernels'
    work is finished on ``tracker``."""

    def __init__(
        self,
        bridge: BridgeClient,
        status: int,
        readiness: Readiness,
        tracker: DependencyTracker,
    ) -> None:
        self.bridge = bridge
        self.status = status
        self.readiness = readiness
        self.tracker = tracker
        self._signal = TimelineSignal(
            read=self._read,
            name="compute",
            compare_bits=32,
            modular=True,
            policy=PollPolicy(spin=0, first_interval=READ_INTERVAL, max_interval=READ_INTERVAL),
        )
        """The timeline as the GPU writes it: 32 bits, compared as serial numbers."""
        self.next_value = 1
        """What the next kernel's RELEASE writes (once its submission has rung the doorbell)."""
        self.epoch = 0
        """Bumped by every recovery: kernels submitted before it are lost."""
        self._completed_at: dict[int, int] = {}
        """Per epoch: the timeline value the device had reached when that recovery began."""
        self._lingering: dict[int, Work] = {}
        """Kernels whose wait ended without their completion, by timeline value."""
        self._taken: deque[float] = deque(maxlen=_RECENT)
        """Seconds the recent waits that saw their kernel complete took."""

    # -- waiting -------------------------------------------------------------------------------

    async def wait(self, value: int, timeout: float, epoch: int) -> None:
        """Await the timeline reaching ``value`` (32-bit compare, as the GPU writes it), within
        ``timeout``; :class:`GpuFault` as soon as the device reports its error state, or if a
        recovery since ``epoch`` reset the queue before the kernel ran."""
        awaited = f"compute timeline >= {value}"
        bound = WaitBound(
            awaited=awaited, error=SignalTimeout, timeout=timeout, layer=Layer.GPU_QUEUE
        )
        if self._taken:  # not read before it is likely to be done (read at once near the bound)
            with anyio.move_on_at(bound.at):
                await pause(_FIRST_READ * min(self._taken))
        timeline = await self._await(value, f"timeline {value}", awaited=awaited, within=bound)
        self._taken.append(now() - bound.started)
        self.completed(value, epoch, timeline)

    def completed(self, value: int, epoch: int, timeline: int | None = None) -> None:
        """The device was seen to complete the kernel of ``value``, submitted in ``epoch`` (with
        the timeline at ``timeline``, default ``value``): :class:`GpuFault` if a recovery since
        lost it after all; lingering kernels it shows finished are released."""
        awaited = f"compute timeline >= {value}"
        for later in range(epoch + 1, self.epoch + 1):
            # A recovery that has not read the timeline yet (or never did: it failed) lost
            # nothing this kernel did: the device has just been seen to complete it.
            completed = self._completed_at.get(later)
            if completed is not None and not self._signal.reached(value, completed):
                raise GpuFault(
                    f"the kernel of timeline {value} was lost to a device recovery",
                    awaited=awaited,
                )
        self._retire(value if timeline is None else timeline)

    async def _await(
        self,
        value: int,
        before: str,
        *,
        awaited: str,
        timeout: float | None = None,
        within: WaitBound | None = None,
    ) -> int:
        """The timeline once it has reached ``value``; :class:`GpuFault`, and the queue's
        readiness down, as soon as the device reports its error state ``before`` that."""
        try:
            return await self._signal.wait(value, timeout=timeout, within=within, awaited=awaited)
        except _ErrorState as state:
            self.error_state(state.error)
            raise GpuFault(
                f"the GPU entered its error state (interrupt 0x{state.error:x}) before {before}",
                source=state.error,
                awaited=awaited,
            ) from None

    def error_state(self, error: int) -> None:
        """The device reported its error state ``error`` (0: it did not): nothing can be
        submitted until a recovery."""
        if error:
            self.readiness.mark_down(
                ReadinessLayer.QUEUE_SUBMITTABLE, f"GPU error state 0x{error:x}"
            )

    async def read_state(self) -> tuple[int, int]:
        """The timeline and the error word. Register-sized reads: they need no bulk pipe, which a
        copy may be holding."""
        value = await self.bridge.mem_read(self.status + hw.STATUS_TIMELINE)
        return value, await self.bridge.mem_read(self.status + hw.STATUS_ERROR)

    async def _read(self) -> int:
        """The signal's read: a device in its error state ends the wait."""
        value, error = await self.read_state()
        if error:
            raise _ErrorState(error)
        return value

    # -- lingering kernels ---------------------------------------------------------------------

    def linger(self, value: int, work: Work) -> None:
        """The wait for the kernel of timeline ``value`` ended without its completion: it may
        still run, so its bytes stay reserved."""
        work.lingering = True
        self._lingering[value] = work

    async def retire_finished(self) -> int:
        """Read the timeline once and release the kernels whose waits ended early (timed out,
        cancelled) that the device has finished since; how many it released."""
        before = len(self._lingering)
        if before:
            self._retire((await self.read_state())[0])
        return before - len(self._lingering)

    def _retire(self, timeline: int) -> None:
        """The device has finished the lingering kernels up to ``timeline``: release them."""
        for ended in [v for v in self._lingering if self._signal.reached(v, timeline)]:
            self.tracker.finish(self._lingering.pop(ended))

    def release(self) -> None:
        """The queue no longer holds any kernel (reset, or stopped): release every lingering
        one."""
        for work in self._lingering.values():
            self.tracker.finish(work)
        self._lingering.clear()

    async def settle(self, work: Work, bound: WaitBound, awaited: str) -> None:
        """Wait (within ``bound``) for the device to finish a lingering kernel that other work
        needs to wait for, reading the timeline (nothing else may be waiting on the device), or
        for a recovery to release it."""
        value = next((v for v, w in self._lingering.items() if w is work), None)
        if value is None:  # finished meanwhile, or released by a recovery
            return
        failure: list[Exception] = []
        async with anyio.create_task_group() as race:

            async def from_device() -> None:
                try:
                    before = f"lingering {work.name} (timeline {value}) finished"
                    self._retire(await self._await(value, before, awaited=awaited, within=bound))
                except Exception as exc:  # raised below, not as an exception group
                    failure.append(exc)
                race.cancel_scope.cancel()

            async def released() -> None:
                await work.done.wait()
                race.cancel_scope.cancel()

            race.start_soon(from_device)
            race.start_soon(released)
        if failure:
            raise failure[0]

    # -- recovery ------------------------------------------------------------------------------

    def lose_pending(self) -> None:
        """A recovery begins: submissions still waiting for their turn now fail at once."""
        self.epoch += 1

    def recovering(self, completed: int) -> int:
        """The recovery read the timeline at ``completed``: kernels past it are lost. Returns the
        value to rewind the timeline to (the last one issued), so that the values the next
        kernels signal follow on."""
        self._completed_at[self.epoch] = completed
        return (self.next_value - 1) & 0xFFFF_FFFF


class _ErrorState(Exception):
    """The device reported its error state while the timeline was read (never leaves this
    module: it becomes a :class:`GpuFault`)."""

    def __init__(self, error: int) -> None:
        super().__init__(f"error state 0x{error:x}")
        self.error = error
