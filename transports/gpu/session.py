"""The device session: one GPU behind one bridge, from open to close.

``await GpuSession.open(usb)`` boots the GPU (:func:`transports.gpu.boot.boot`: link up, the GPU
checked, firmware and queues, readiness layers marked as stages complete) and takes over the
booted device. Then: memory (:meth:`alloc` / :meth:`free`, staged with rollback: every path frees
what it took), host mappings (:meth:`map_host` / :meth:`unmap`, symmetric), copies
(:meth:`copy_in` / :meth:`copy_out` through :class:`~transports.gpu.copy.CopyProtocol`), kernels
(:meth:`run_kernel`, awaiting the compute timeline with a deadline:
:class:`~transports.gpu.timeline.ComputeTimeline`; :meth:`run_kernel_and_copy_out`, through the
copy-out of its output queued behind it), :meth:`recover` (never a sticky error),
:meth:`aclose`, and :meth:`abandon` (a close for a device that no longer answers).

Work on the copy and compute queues is ordered by a :class:`~transports.gpu.deps.DependencyTracker`
over the byte ranges it touches.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import anyio

from aio_runtime import (
    AsyncResource,
    DeviceLost,
    Layer,
    LedgerKind,
    Readiness,
    ReadinessLayer,
    RuntimeFault,
    SignalTimeout,
    Stages,
    WaitBound,
    current_ledger,
    get_logger,
)

from ..bridge import BridgeClient, Channel
from ..errors import GpuFault
from ..protocol import gpu as hw
from ..usb import UsbTransport
from .boot import BootedDevice, boot, scan_interrupts
from .buffers import Buffer, HostMapping
from .config import SessionConfig
from .copy import After
from .deps import DependencyTracker, Work
from .queues import Packets
from .timeline import ComputeTimeline

__all__ = ["Buffer", "GpuSession", "HostMapping"]

_log = get_logger(__name__)


class GpuSession(AsyncResource):
    """A booted GPU (``device``) behind ``bridge``; :meth:`open` boots one."""

    def __init__(
        self,
        bridge: BridgeClient,
        device: BootedDevice,
        config: SessionConfig,
        readiness: Readiness,
    ) -> None:
        self.config = config
        self.bridge = bridge
        self.usb = bridge.usb
        self.regs = device.regs
        self.status = device.status
        """The status page: compute timeline, error word, ``usb_go``."""
        self.heap = device.heap
        self.compute = device.compute
        self.copy = device.copy
        self.boot_log = device.log
        self.readiness = readiness
        self.tracker = DependencyTracker(settle=self._settle)
        self.timeline = ComputeTimeline(bridge, device.status, readiness, self.tracker)
        self.interrupts: list[int] = []
        """Interrupt sources seen by the last IH scan (in :meth:`recover`)."""
        # Taken before any bridge channel, copy before compute (recover() takes both).
        turn = functools.partial(
            Channel, timeout=config.turn_timeout, error=SignalTimeout, layer=Layer.GPU_QUEUE
        )
        self._copy_turn = turn("the copy queue")
        self._compute_turn = turn("the compute queue")
        self._buffers: set[Buffer] = set()
        self._mappings: set[HostMapping] = set()
        self._closed = False

    @classmethod
    async def open(
        cls,
        usb: UsbTransport,
        *,
        config: SessionConfig | None = None,
        readiness: Readiness | None = None,
    ) -> GpuSession:
        config = config or SessionConfig()
        readiness = readiness or Readiness()
        bridge = BridgeClient(
            usb,
            control_timeout=config.control_timeout,
            request_timeout=config.request_timeout,
            bulk_timeout=config.bulk_timeout,
            channel_timeout=config.channel_timeout,
        )
        return cls(bridge, await boot(bridge, config, readiness), config, readiness)

    # -- memory --------------------------------------------------------------------------------

    async def alloc(self, size: int, *, zero: bool = False, align: int = 0x1000) -> Buffer:
        """VRAM for ``size`` bytes (optionally zeroed). If any stage fails, what earlier stages
        took is given back before the error propagates."""
        self._check_open()
        async with Stages(f"VRAM buffer of {size} bytes") as stages:
            block = await stages.acquire(
                lambda: self.heap.alloc(size, align=align), self.heap.free, label="vram"
            )
            if zero:
                await self._copy_in_span(block.offset, bytes(size))
            buffer = Buffer(block.offset, size, stages.commit())
        self._buffers.add(buffer)
        return buffer

    async def free(self, buffer: Buffer) -> None:
        """Give ``buffer`` back once no work in progress uses it (that wait is bounded; if it
        times out the buffer stays allocated)."""
        if buffer not in self._buffers:
            raise ValueError(f"{buffer} is not a live buffer of this session (freed twice?)")
        async with self.tracker.ordered(
            "host",
            "free",
            writes=[buffer.span],
            timeout=self.config.turn_timeout,
            tolerate_failures=True,  # work that used it and failed is over all the same
        ):
            pass
        self._buffers.discard(buffer)
        await buffer.owner.release()

    def map_host(self, memory: Any) -> HostMapping:
        """Register a host buffer for copies; :meth:`unmap` undoes exactly this."""
        view = memoryview(memory).cast("B")
        mapping = HostMapping(
            view, current_ledger().open(LedgerKind.HOST_MAPPING, f"{len(view)} bytes")
        )
        self._mappings.add(mapping)
        return mapping

    def unmap(self, mapping: HostMapping) -> None:
        if mapping not in self._mappings:
            raise ValueError("not a live mapping of this session (unmapped twice?)")
        self._mappings.discard(mapping)
        current_ledger().close(mapping.entry)
        mapping.memory.release()

    # -- copies --------------------------------------------------------------------------------

    async def copy_in(self, buffer: Buffer, *parts: Any, offset: int = 0) -> None:
        """Copy host bytes into ``buffer`` (after conflicting work on the same bytes): one part,
        or several laid back to back — one copy either way."""
        size = sum(memoryview(part).nbytes for part in parts)
        buffer.check_range(offset, size)
        await self._copy_in_span(buffer.address + offset, *parts)

    async def _copy_in_span(self, start: int, *parts: Any) -> None:
        size = sum(memoryview(part).nbytes for part in parts)
        async with self._copying("in", start, size):
            await self.copy.copy_in(start, *parts)

    async def copy_out(
        self, buffer: Buffer, size: int | None = None, *, offset: int = 0, out: Any = None
    ) -> Any:
        """Copy ``size`` bytes of ``buffer`` to the host (into ``out``, or a new bytearray)."""
        size = buffer.size - offset if size is None else size
        buffer.check_range(offset, size)
        start = buffer.address + offset
        async with self._copying("out", start, size):
            return await self.copy.copy_out(start, size, out)

    @contextlib.asynccontextmanager
    async def _copying(self, direction: str, start: int, size: int) -> AsyncIterator[None]:
        """The copy queue for a copy-``direction`` of ``size`` bytes of VRAM at ``start``, once
        earlier work on those bytes allows (a copy-in writes them, a copy-out reads them)."""
        span = [(start, start + size)]
        async with self.tracker.ordered(
            "copy",
            f"copy-{direction} {size} bytes",
            reads=span if direction == "out" else (),
            writes=span if direction == "in" else (),
            timeout=self.config.turn_timeout,
        ):
            async with self._copy_turn.hold(f"copy-{direction} of {size} bytes"):
                yield

    # -- compute -------------------------------------------------------------------------------

    async def run_kernel(
        self,
        kernel: int,
        args: Sequence[Buffer | int],
        *,
        reads: Sequence[Buffer] = (),
        writes: Sequence[Buffer] = (),
        timeout: float | None = None,
        on_submitted: Callable[[], object] | None = None,
    ) -> int:
        """Dispatch ``kernel`` and await its timeline value (returned), within ``timeout``
        (default ``kernel_timeout``) of its submission; ``on_submitted()`` is called once the
        doorbell has rung. A kernel whose wait ends without its completion keeps its buffers
        reserved (it may still run) until the device is done with it or :meth:`recover` resets
        the queue."""
        limit = self.config.kernel_timeout if timeout is None else timeout
        async with self._kernel(kernel, args, reads, writes, limit, on_submitted) as (value, epoch):
            await self.timeline.wait(value, limit, epoch)
        return value

    async def run_kernel_and_copy_out(
        self,
        kernel: int,
        args: Sequence[Buffer | int],
        output: Buffer,
        *,
        reads: Sequence[Buffer] = (),
        timeout: float | None = None,
        on_submitted: Callable[[], object] | None = None,
    ) -> tuple[int, Any]:
        """Dispatch ``kernel``, which writes ``output``, and copy ``output`` to the host once it
        has finished: ``(timeline value, bytearray)``, within ``timeout`` (errors and lingering as
        :meth:`run_kernel`). The copy-out is queued behind the kernel on the device (the copy
        engine waits for its release): its first bulk IN completes once the output is in bridge
        SRAM, so the host learns that the kernel finished without reading the timeline (awaited
        first instead past what the copy engine can wait for). Meanwhile the copy queue is held
        (other copies and :meth:`recover` wait), and an error state is seen only at the bound: a
        caller wanting it sooner reads ``timeline.read_state()`` meanwhile."""
        limit = self.config.kernel_timeout if timeout is None else timeout
        if not self._copy_engine_can_wait(limit):
            value = await self.run_kernel(
                kernel, args, reads=reads, writes=[output], timeout=limit, on_submitted=on_submitted
            )
            return value, await self.copy_out(output)
        async with self._kernel(kernel, args, reads, [output], limit, on_submitted) as (
            value,
            epoch,
        ):
            awaited = f"compute timeline >= {value}"
            after = After(self.status + hw.STATUS_TIMELINE, value, limit, awaited)
            try:
                async with self._copy_turn.hold(f"copy-out of {output.size} bytes after {awaited}"):
                    data = await self.copy.copy_out(output.address, output.size, after=after)
            except GpuFault as fault:
                self.timeline.error_state(fault.source)
                raise
            self.timeline.completed(value, epoch)
        return value, data

    @property
    def queued_wait_limit(self) -> float:
        """The longest bound :meth:`run_kernel_and_copy_out` waits for a kernel with its
        copy-out queued behind it on the device: nine tenths of the copy engine's watchdog
        (unbounded without one). A longer bound is awaited on the timeline, read from the host
        (two bridge requests a read, several reads a kernel)."""
        watchdog = self.config.copy_watchdog_ms / 1000
        return 0.9 * watchdog if watchdog else math.inf

    def _copy_engine_can_wait(self, limit: float) -> bool:
        """Whether the copy engine can wait for the next kernel's release (``limit`` within
        :attr:`queued_wait_limit`; its unsigned compare is not met early: no wrap in the last
        65 536 values)."""
        value = self.timeline.next_value
        return limit <= self.queued_wait_limit and (
            value < 1 << 32 or value & 0xFFFF_FFFF >= 1 << 16
        )

    @contextlib.asynccontextmanager
    async def _kernel(
        self,
        kernel: int,
        args: Sequence[Buffer | int],
        reads: Sequence[Buffer],
        writes: Sequence[Buffer],
        limit: float,
        on_submitted: Callable[[], object] | None,
    ) -> AsyncIterator[tuple[int, int]]:
        """Dispatch ``kernel`` once earlier work on its buffers allows; yield its timeline value
        and epoch for the body to await it. A body that fails leaves it lingering."""
        self._check_open()
        words = [a.address if isinstance(a, Buffer) else a for a in args]
        timeline = self.timeline
        epoch = timeline.epoch
        name = f"kernel {kernel}"
        async with self.tracker.ordered(
            "compute",
            name,
            reads=[b.span for b in reads],
            writes=[b.span for b in writes],
            timeout=self.config.turn_timeout,
        ) as work:
            async with self._compute_turn.hold(name):
                if timeline.epoch != epoch:
                    raise GpuFault(f"{name} was lost to a device recovery before it was submitted")
                value = timeline.next_value
                packets = Packets().dispatch(kernel, words)
                packets.release(self.status + hw.STATUS_TIMELINE, value)
                await self.compute.submit(packets, timeout=limit)
                timeline.next_value += 1
            if on_submitted is not None:
                on_submitted()
            try:
                yield value, epoch
            except BaseException:
                timeline.linger(value, work)
                raise

    async def retire_finished(self) -> int:
        """Release the kernels whose waits ended early that the device has finished since (one
        read of the timeline); how many it released."""
        return await self.timeline.retire_finished()

    async def _settle(self, work: Work, bound: WaitBound, awaited: str) -> None:
        """The tracker's question about lingering work, answered by the timeline."""
        await self.timeline.settle(work, bound, awaited)

    # -- recovery and close --------------------------------------------------------------------

    async def recover(self) -> list[int]:
        """Reset every queue (copy engine included), rewind the timeline, clear the error state.
        Returns the interrupt sources found in the IH ring. Kernels that had not completed are
        lost: their waiters fail with :class:`GpuFault` ("lost to a device recovery"), and so do
        submissions still waiting for their turn; kernels that had completed stand."""
        self._check_open()
        regs = self.regs
        self.timeline.lose_pending()
        async with self._copy_turn.hold("recover"), self._compute_turn.hold("recover"):
            self.interrupts = await scan_interrupts(regs)
            completed = await self.bridge.mem_read(self.status + hw.STATUS_TIMELINE)
            rewind = self.timeline.recovering(completed)
            await self.compute.reset()
            self.timeline.release()  # the queue no longer holds them
            await regs.write(hw.IH_CNTL // 4, 2)  # clear the error state
            await regs.write(hw.VM_FAULT_STATUS // 4, 0)
            await self.bridge.mem_write(self.status + hw.STATUS_TIMELINE, rewind)
            await self.bridge.mem_write(self.status + hw.STATUS_ERROR, 0)
            await self.copy.restore()
        self.readiness.mark_up(ReadinessLayer.QUEUE_SUBMITTABLE)
        _log.info("gpu recovered", interrupts=[hex(i) for i in self.interrupts])
        return self.interrupts

    async def aclose(self) -> None:
        """Stop both queues, record in SCRATCH_REG6 whether the next open may partial-boot (only
        after a clean session: no error state), then free what is still allocated and unmap what
        is mapped. The device part is shielded and bounded; a device that is gone leaves
        SCRATCH_REG6 saying "in use", so the next open boots fully."""
        if self._closed:
            return
        self._closed = True
        try:
            with anyio.CancelScope(shield=True), anyio.move_on_after(self.config.request_timeout):
                try:
                    for ring in (self.copy.ring, self.compute):
                        await self.bridge.mem_write(
                            hw.MMIO_BASE + ring.block + hw.RB_CNTL, hw.CNTL_RESET
                        )
                    error = await self.bridge.mem_read(self.status + hw.STATUS_ERROR)
                    await self.regs.write(hw.SCRATCH_REG6 // 4, error)
                except RuntimeFault as exc:
                    _log.warning("gpu close could not record a clean end", error=str(exc))
            await self._release()  # the queues are stopped: nothing uses what they held
        finally:
            await self._closed_down()

    async def abandon(self) -> None:
        """Close without a word to the device: for one that does not answer (see
        :func:`~transports.gpu.boot.bridge_answers`), whose transfers would only wait out their
        bounds. What the session holds is released as :meth:`aclose` releases it (its queues
        may still hold work: SCRATCH_REG6 still says "in use", so the next open boots fully,
        resetting the device where its firmware runs and setting the queues up afresh, before
        a new session hands out any memory)."""
        if self._closed:
            return
        self._closed = True
        try:
            await self._release()
        finally:
            await self._closed_down()
        _log.info("gpu session abandoned: the device did not answer")

    async def _release(self) -> None:
        self.timeline.release()
        for buffer in list(self._buffers):
            self._buffers.discard(buffer)
            await buffer.owner.release()
        for mapping in list(self._mappings):
            self.unmap(mapping)

    async def _closed_down(self) -> None:
        self.readiness.mark_down(ReadinessLayer.DEVICE_ONLINE, "session closed")
        await self.usb.aclose()

    def _check_open(self) -> None:
        if self._closed:
            raise DeviceLost("the GPU session is closed", layer=Layer.GPU_QUEUE)
