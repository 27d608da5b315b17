"""The device session: one GPU behind one bridge, from open to close.

``await GpuSession.open(usb)`` brings the PCIe link up (bounded), checks the GPU answers, and
boots it (:mod:`transports.gpu.boot`), marking readiness layers as stages complete. Then:
memory (:meth:`alloc` / :meth:`free`, staged with rollback: every path frees what it took), host
mappings (:meth:`map_host` / :meth:`unmap`, symmetric), copies (:meth:`copy_in` /
:meth:`copy_out` through :class:`~transports.gpu.copy.CopyProtocol`), kernels (:meth:`run_kernel`,
awaiting the compute timeline with a deadline), :meth:`recover` (never a sticky error) and
:meth:`aclose`.

Work on the copy and compute queues is ordered by a :class:`~transports.gpu.deps.DependencyTracker`
over the byte ranges it touches.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio

from aio_runtime import (
    DeviceLost,
    FirmwareTimeout,
    Layer,
    Owned,
    RangeAllocator,
    Readiness,
    ReadinessLayer,
    RuntimeFault,
    SignalTimeout,
    Stages,
    TimelineSignal,
    WaitBound,
    current_ledger,
    get_logger,
    pause,
)

from ..bridge import BridgeClient, Channel
from ..errors import GpuFault
from ..protocol import gpu as hw
from ..protocol.bridge import EP_BULK_OUT, SRAM_PCIE
from ..usb import UsbTransport
from .boot import BootLog, BridgeRegisters, Psp, boot_mode, smu_mailbox
from .copy import CopyProtocol
from .deps import DependencyTracker, Span, Work
from .queues import Packets, Ring

__all__ = ["Buffer", "GpuSession", "HostMapping", "SessionConfig"]

_log = get_logger("transports.gpu")
RING_SIZE = 0x10000
SDMA_RING, COMPUTE_RING, PSP_RING, PSP_COMMANDS, PSP_FENCE = 0, 0x10000, 0x20000, 0x21000, 0x22000
HEAP_OFFSET = 0x10_0000


@dataclass
class SessionConfig:
    """Bounds of every wait (seconds) and the pauses the hardware needs."""

    control_timeout: float = 1.0
    request_timeout: float = 5.0
    link_timeout: float = 2.0
    firmware_timeout: float = 10.0
    smu_probe_timeout: float = 0.1
    bulk_timeout: float = 10.0
    fence_timeout: float = 10.0
    kernel_timeout: float = 10.0
    copy_watchdog_ms: int = 10_000
    mode1_reset_pause: float = 0.5
    compute_ring_size: int = RING_SIZE
    """Bytes of compute-queue ring: a power of two, 64 B to 64 KiB (a dispatch is ~48 bytes)."""
    turn_timeout: float = 60.0
    """How long work waits for its turn on a queue (another copy, another submission)."""

    @property
    def channel_timeout(self) -> float:
        """How long a bridge channel may be waited for: longer than any holder keeps one (a
        copy chunk's bulk transfer, then a fence wait, then a diagnosis)."""
        return self.bulk_timeout + self.fence_timeout + 2 * self.request_timeout


@dataclass(eq=False)
class Buffer:
    """VRAM: ``size`` bytes at bus (and GPU) address ``address``."""

    address: int
    size: int
    owner: Owned = field(repr=False)

    @property
    def span(self) -> Span:
        return (self.address, self.address + self.size)


@dataclass(eq=False)
class HostMapping:
    """A host buffer registered with the session (its bytes stay put until :meth:`unmap`)."""

    memory: memoryview
    entry: Any = field(repr=False)


class GpuSession:
    def __init__(self, usb: UsbTransport, config: SessionConfig, readiness: Readiness) -> None:
        self.config = config
        self.usb = usb
        self.bridge = BridgeClient(
            usb,
            control_timeout=config.control_timeout,
            request_timeout=config.request_timeout,
            bulk_timeout=config.bulk_timeout,
            channel_timeout=config.channel_timeout,
        )
        self.regs = BridgeRegisters(self.bridge)
        self.readiness = readiness
        self.tracker = DependencyTracker(settle=self._settle)
        self.boot_log = BootLog()
        self.interrupts: list[int] = []
        """Interrupt sources seen by the last IH scan (in :meth:`recover`)."""
        # Taken before any bridge channel, copy before compute (recover() takes both).
        turn = {"timeout": config.turn_timeout, "error": SignalTimeout, "layer": Layer.GPU_QUEUE}
        self._copy_turn = Channel("the copy queue", **turn)  # type: ignore[arg-type]
        self._compute_turn = Channel("the compute queue", **turn)  # type: ignore[arg-type]
        self._buffers: set[Buffer] = set()
        self._mappings: set[HostMapping] = set()
        self._next_value = 1
        self._epoch = 0
        """Bumped by every recover(): kernels submitted before it are lost."""
        self._completed_at: dict[int, int] = {}
        """Per epoch: the timeline value the device had reached when that recovery began."""
        self._lingering: dict[int, Work] = {}
        """Kernels whose wait ended without their completion, by timeline value."""
        self.timeline = TimelineSignal(
            read=self._read_timeline, name="compute", compare_bits=32, modular=True
        )
        """The compute timeline as the GPU writes it: 32 bits, compared as serial numbers."""
        self._closed = False

    # -- open and boot -------------------------------------------------------------------------

    @classmethod
    async def open(
        cls,
        usb: UsbTransport,
        *,
        config: SessionConfig | None = None,
        readiness: Readiness | None = None,
    ) -> GpuSession:
        session = cls(usb, config or SessionConfig(), readiness or Readiness())
        await session._boot()
        return session

    async def _boot(self) -> None:
        cfg, regs, log = self.config, self.regs, self.boot_log
        await self.bridge.bring_up_link(timeout=cfg.link_timeout)
        ident = await self.bridge.config_read(hw.GPU_BUS, hw.GPU_DEVICE, hw.GPU_FUNCTION, 0)
        if ident != hw.GPU_ID:
            raise DeviceLost(
                f"no GPU behind the bridge (config id 0x{ident:08x}, expected 0x{hw.GPU_ID:08x})",
                layer=Layer.PCIE_REQUEST,
            )
        vram = (await regs.read(hw.VRAM_SIZE_MB // 4)) << 20  # discovery
        self.status = hw.VRAM_BASE + vram - hw.STATUS_PAGE_SIZE
        error = await self.bridge.mem_read(self.status + hw.STATUS_ERROR)
        log.mode = "full" if error else await boot_mode(regs)  # an error state: boot it afresh
        self._step("SOC", f"GPU 0x{ident:08x}, {log.mode} boot")
        self.readiness.mark_up(ReadinessLayer.DEVICE_ONLINE)
        self._step("readiness", "device_online")

        self.heap = RangeAllocator(
            vram - HEAP_OFFSET - hw.STATUS_PAGE_SIZE,
            base=hw.VRAM_BASE + HEAP_OFFSET,
            name="VRAM heap",
        )
        await self.bridge.write_stream(self.status, bytes(16))
        self._step("GMC", f"{vram >> 20} MiB VRAM, heap {self.heap.capacity >> 20} MiB")

        await self._scan_interrupts()
        await regs.write(hw.IH_CNTL // 4, 2)
        self._step("IH", "ring acknowledged, error state clear")

        smu = smu_mailbox(regs, cfg.firmware_timeout)
        psp = Psp(
            self.bridge,
            regs,
            ring=hw.VRAM_BASE + PSP_RING,
            commands=hw.VRAM_BASE + PSP_COMMANDS,
            fence=hw.VRAM_BASE + PSP_FENCE,
            timeout=cfg.firmware_timeout,
            stage_image=self._stage_image,
        )
        if log.mode == "full":
            if await psp.sos_alive() and await self._smu_answers(smu):
                await regs.write(hw.SMU_MSG // 4, hw.SmuMessage.MODE1_RESET)
                await pause(cfg.mode1_reset_pause)
                self._step("SOC", "mode-1 reset (firmware was running)")
            if await psp.sos_alive():
                self._step("PSP", "sOS already running")
            else:
                await psp.load_sos(log)
            await psp.create_ring(log)
            await psp.submit(hw.PspCommand.LOAD_TOC, 0, log)
            await psp.submit(hw.PspCommand.SETUP_TMR, 0, log)
            for firmware in hw.Firmware:
                await psp.submit(hw.PspCommand.LOAD_IP_FW, firmware, log)
            self._step("PSP", "firmware loaded")
            table = hw.VRAM_BASE + PSP_FENCE + 0x1000
            await smu.send(hw.SmuMessage.DRIVER_TABLE_HIGH, table >> 32)
            await smu.send(hw.SmuMessage.DRIVER_TABLE_LOW, table & 0xFFFF_FFFF)
            await smu.send(hw.SmuMessage.ENABLE_ALL_FEATURES)
            self._step("SMU", "features enabled")
        else:
            self._step("PSP", "sOS running (partial boot)")
            await smu.send(hw.SmuMessage.TEST)
            self._step("SMU", "answering (partial boot)")
        self.readiness.mark_up(ReadinessLayer.FIRMWARE_READY)
        self._step("readiness", "firmware_ready")

        self.compute = Ring(
            self.bridge,
            hw.COMPUTE,
            hw.VRAM_BASE + COMPUTE_RING,
            cfg.compute_ring_size,
            "compute",
            timeout=cfg.kernel_timeout,
        )
        await self.compute.setup()
        self._step("GFX", "compute queue " + ("programmed" if log.mode == "full" else "reset"))

        copy_ring = Ring(self.bridge, hw.SDMA, hw.VRAM_BASE + SDMA_RING, RING_SIZE, "copy")
        await copy_ring.setup()
        await regs.write(hw.SDMA_WATCHDOG // 4, cfg.copy_watchdog_ms)
        self.copy = CopyProtocol(
            self.bridge,
            copy_ring,
            usb_go=self.status + hw.STATUS_USB_GO,
            status=self.status,
            bulk_timeout=cfg.bulk_timeout,
            fence_timeout=cfg.fence_timeout,
        )
        await self.copy.restore()
        self._step("SDMA", "copy queue programmed")

        await regs.write(hw.SCRATCH_REG7 // 4, hw.AM_VERSION)
        await regs.write(hw.SCRATCH_REG6 // 4, 1)
        self.readiness.mark_up(ReadinessLayer.QUEUE_SUBMITTABLE)
        self._step("readiness", "queue_submittable")
        _log.info("gpu booted", mode=log.mode, steps=len(log.steps))

    def _step(self, block: str, what: str) -> None:
        self.boot_log.steps.append(f"{block}: {what}")

    async def _smu_answers(self, smu: Any) -> bool:
        try:
            await smu.send(hw.SmuMessage.TEST, timeout=self.config.smu_probe_timeout)
        except FirmwareTimeout:
            smu.reset()  # no SMU firmware runs: nothing will answer the probe later either
            return False
        return True

    async def _stage_image(self, component: int) -> int:
        """A firmware component's image, staged in bridge SRAM for the PSP bootloader."""
        image = bytearray(0x4000)
        image[:4] = component.to_bytes(4, "little")
        async with self.bridge.out_pipe.hold("a firmware image"):
            await self.bridge.arm_sram(read=False, slot=0, length=len(image))
            await self.usb.bulk_out(EP_BULK_OUT, image, timeout=self.config.bulk_timeout)
        return SRAM_PCIE

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
        mapping = HostMapping(view, current_ledger().open("host mapping", f"{len(view)} bytes"))
        self._mappings.add(mapping)
        return mapping

    def unmap(self, mapping: HostMapping) -> None:
        if mapping not in self._mappings:
            raise ValueError("not a live mapping of this session (unmapped twice?)")
        self._mappings.discard(mapping)
        current_ledger().close(mapping.entry)
        mapping.memory.release()

    # -- copies --------------------------------------------------------------------------------

    async def copy_in(self, buffer: Buffer, data: Any, *, offset: int = 0) -> None:
        """Copy host bytes into ``buffer`` (after conflicting work on the same bytes)."""
        size = memoryview(data).nbytes
        self._check_range(buffer, offset, size)
        await self._copy_in_span(buffer.address + offset, data)

    async def _copy_in_span(self, start: int, data: Any) -> None:
        size = memoryview(data).nbytes
        async with self.tracker.ordered(
            "copy",
            f"copy-in {size} bytes",
            writes=[(start, start + size)],
            timeout=self.config.turn_timeout,
        ):
            async with self._copy_turn.hold(f"copy-in of {size} bytes"):
                await self.copy.copy_in(start, data)

    async def copy_out(
        self, buffer: Buffer, size: int | None = None, *, offset: int = 0, out: Any = None
    ) -> Any:
        """Copy ``size`` bytes of ``buffer`` to the host (into ``out``, or a new bytearray)."""
        size = buffer.size - offset if size is None else size
        self._check_range(buffer, offset, size)
        start = buffer.address + offset
        async with self.tracker.ordered(
            "copy",
            f"copy-out {size} bytes",
            reads=[(start, start + size)],
            timeout=self.config.turn_timeout,
        ):
            async with self._copy_turn.hold(f"copy-out of {size} bytes"):
                return await self.copy.copy_out(start, size, out)

    @staticmethod
    def _check_range(buffer: Buffer, offset: int, size: int) -> None:
        if offset < 0 or size < 0 or offset + size > buffer.size:
            raise ValueError(
                f"{size} bytes at offset {offset} do not fit a buffer of {buffer.size} bytes"
            )

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
        self._check_open()
        words = [a.address if isinstance(a, Buffer) else a for a in args]
        limit = self.config.kernel_timeout if timeout is None else timeout
        epoch = self._epoch
        name = f"kernel {kernel}"
        async with self.tracker.ordered(
            "compute",
            name,
            reads=[b.span for b in reads],
            writes=[b.span for b in writes],
            timeout=self.config.turn_timeout,
        ) as work:
            async with self._compute_turn.hold(name):
                if self._epoch != epoch:
                    raise GpuFault(f"{name} was lost to a device recovery before it was submitted")
                value = self._next_value
                packets = Packets().dispatch(kernel, words)
                packets.release(self.status + hw.STATUS_TIMELINE, value)
                await self.compute.submit(packets, timeout=limit)
                self._next_value += 1
            if on_submitted is not None:
                on_submitted()
            try:
                await self._wait_timeline(value, limit, epoch)
            except BaseException:
                work.lingering = True  # it may still run: its bytes stay reserved
                self._lingering[value] = work
                raise
        return value

    async def _wait_timeline(self, value: int, timeout: float, epoch: int) -> None:
        """Await the compute timeline reaching ``value`` (32-bit compare, as the GPU writes it);
        :class:`GpuFault` as soon as the device reports its error state, or if a recovery since
        ``epoch`` reset the queue before the kernel ran."""
        awaited = f"compute timeline >= {value}"
        timeline = await self._await_timeline(
            value, f"timeline {value}", awaited=awaited, timeout=timeout
        )
        for later in range(epoch + 1, self._epoch + 1):
            if not self.timeline.reached(value, self._completed_at[later]):
                raise GpuFault(
                    f"the kernel of timeline {value} was lost to a device recovery",
                    awaited=awaited,
                )
        self._retire(timeline)

    async def _await_timeline(
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
            return await self.timeline.wait(value, timeout=timeout, within=within, awaited=awaited)
        except _ErrorState as state:
            self.readiness.mark_down(
                ReadinessLayer.QUEUE_SUBMITTABLE, f"GPU error state 0x{state.error:x}"
            )
            raise GpuFault(
                f"the GPU entered its error state (interrupt 0x{state.error:x}) before {before}",
                source=state.error,
                awaited=awaited,
            ) from None

    async def retire_finished(self) -> int:
        """Read the timeline once and release the kernels whose waits ended early (timed out,
        cancelled) that the device has finished since; how many it released."""
        before = len(self._lingering)
        if before:
            self._retire((await self._read_state())[0])
        return before - len(self._lingering)

    def _retire(self, timeline: int) -> None:
        """The device has finished the lingering kernels up to ``timeline``: release them."""
        for ended in [v for v in self._lingering if self.timeline.reached(v, timeline)]:
            self.tracker.finish(self._lingering.pop(ended))

    async def _settle(self, work: Work, bound: WaitBound, awaited: str) -> None:
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
                    timeline = await self._await_timeline(
                        value, before, awaited=awaited, within=bound
                    )
                    self._retire(timeline)
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

    async def _read_state(self) -> tuple[int, int]:
        """The timeline and the error word. Register-sized reads: they need no bulk pipe, which a
        copy may be holding."""
        value = await self.bridge.mem_read(self.status + hw.STATUS_TIMELINE)
        return value, await self.bridge.mem_read(self.status + hw.STATUS_ERROR)

    async def _read_timeline(self) -> int:
        """The timeline signal's read: a device in its error state ends the wait."""
        value, error = await self._read_state()
        if error:
            raise _ErrorState(error)
        return value

    # -- recovery and close --------------------------------------------------------------------

    async def recover(self) -> list[int]:
        """Reset every queue (copy engine included), rewind the timeline, clear the error state.
        Returns the interrupt sources found in the IH ring. Kernels that had not completed are
        lost: their waiters fail with :class:`GpuFault` ("lost to a device recovery"), and so do
        submissions still waiting for their turn; kernels that had completed stand."""
        self._check_open()
        regs = self.regs
        self._epoch += 1  # submissions waiting for their turn now fail at once
        async with self._copy_turn.hold("recover"), self._compute_turn.hold("recover"):
            self.interrupts = await self._scan_interrupts()
            completed = await self.bridge.mem_read(self.status + hw.STATUS_TIMELINE)
            self._completed_at[self._epoch] = completed
            await self.compute.reset()
            for work in self._lingering.values():  # the queue no longer holds them
                self.tracker.finish(work)
            self._lingering.clear()
            await regs.write(hw.IH_CNTL // 4, 2)  # clear the error state
            await regs.write(hw.VM_FAULT_STATUS // 4, 0)
            timeline = (self._next_value - 1) & 0xFFFF_FFFF
            await self.bridge.mem_write(self.status + hw.STATUS_TIMELINE, timeline)
            await self.bridge.mem_write(self.status + hw.STATUS_ERROR, 0)
            await self.copy.restore()
        self.readiness.mark_up(ReadinessLayer.QUEUE_SUBMITTABLE)
        _log.info("gpu recovered", interrupts=[hex(i) for i in self.interrupts])
        return self.interrupts

    async def _scan_interrupts(self) -> list[int]:
        """The interrupt sources since the last scan (the ring keeps the last 64); acknowledged."""
        regs = self.regs
        wptr = await regs.read(hw.IH_WPTR // 4)
        rptr = await regs.read(hw.IH_RPTR // 4)
        sources = [
            await regs.read((hw.IH_ENTRY + 4 * (i % hw.IH_ENTRIES)) // 4)
            for i in range(max(rptr, wptr - hw.IH_ENTRIES), wptr)
        ]
        await regs.write(hw.IH_RPTR // 4, wptr)
        return sources

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
            for work in self._lingering.values():  # the queues are stopped
                self.tracker.finish(work)
            self._lingering.clear()
            for buffer in list(self._buffers):  # the queues are stopped: nothing uses them now
                self._buffers.discard(buffer)
                await buffer.owner.release()
            for mapping in list(self._mappings):
                self.unmap(mapping)
        finally:
            self.readiness.mark_down(ReadinessLayer.DEVICE_ONLINE, "session closed")
            await self.usb.aclose()

    def _check_open(self) -> None:
        if self._closed:
            raise DeviceLost("the GPU session is closed", layer=Layer.GPU_QUEUE)

    async def __aenter__(self) -> GpuSession:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


class _ErrorState(Exception):
    """The device reported its error state while the timeline was read (never leaves the
    session: it becomes a :class:`GpuFault`)."""

    def __init__(self, error: int) -> None:
        super().__init__(f"error state 0x{error:x}")
        self.error = error
