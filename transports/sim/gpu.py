"""The simulated GPU behind the bridge: VRAM, MMIO registers, the copy engine and compute queue,
the interrupt ring and error state, SMU and PSP firmware (layout: :mod:`transports.protocol.gpu`).

It is the bridge's :class:`~transports.sim.pcie.PcieTarget` (config space of bus 4 device 0,
MMIO, VRAM) and reaches bridge memory through the bridge's DMA side. PCIe power off (0xF3) takes it
down: registers, firmware and queues reset, VRAM lost — the next session must boot it fully.
"""

from __future__ import annotations

import mmap
import struct
import sys
from collections import deque
from collections.abc import Callable
from typing import Any

import anyio
import anyio.abc
import numpy as np

from aio_runtime import ExcInfo

from ..protocol import gpu as hw
from .bridge import SimBridge
from .engines import ComputeQueue, CopyEngine, Kernel, QueueEngine
from .faults import Fault, FaultPlan
from .firmware import SimPsp, SimSmu

__all__ = ["SimDevice", "SimGpu"]

_QUEUE_SPAN = 0x100


class SimGpu:
    def __init__(
        self,
        plan: FaultPlan,
        *,
        vram_size: int = 64 << 20,
        firmware_latency: float = 0.0,
    ) -> None:
        if vram_size % (1 << 20) or vram_size < (4 << 20):
            raise ValueError(
                f"VRAM size must be a whole number of MiB, at least 4, got {vram_size}"
            )
        self.plan = plan
        # Anonymous memory, zeroed page by page as it is first touched: no memset of the whole
        # VRAM (tens of milliseconds) on the event loop as the device is made or powered off.
        self.vram = mmap.mmap(-1, vram_size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        self._vram_view = memoryview(self.vram)
        self.bridge: SimBridge | None = None
        self.registers: dict[int, int] = {}
        self.copy = CopyEngine(self)
        self.compute = ComputeQueue(self)
        self.smu = SimSmu(self, firmware_latency)
        self.psp = SimPsp(self, firmware_latency)
        self.kernels: dict[int, Kernel] = {}
        self.interrupts: deque[tuple[hw.Interrupt, str]] = deque(maxlen=hw.IH_ENTRIES)
        """The interrupt ring: the last IH_ENTRIES interrupts, with a note on each."""
        self.ih_wptr = 0
        self.ih_rptr = 0
        self.error = 0
        self.firmware: list[hw.Firmware] = []
        self._changed: anyio.Event | None = None
        self._tg: anyio.abc.TaskGroup | None = None
        self._timers: set[anyio.CancelScope] = set()
        self.status_address = hw.VRAM_BASE + vram_size - hw.STATUS_PAGE_SIZE

    def attach(self, bridge: SimBridge) -> None:
        self.bridge = bridge
        bridge.on_sram_write = self._sram_written
        bridge.on_power = self.power

    def _sram_written(self, offset: int, length: int) -> None:
        """A bulk OUT landed in bridge SRAM. ``CORRUPT_SENTINEL``: its last dword (where a copy-in
        chunk carries its sentinel) arrives damaged."""
        if length >= 4 and self.plan.check(Fault.CORRUPT_SENTINEL) and self.bridge is not None:
            end = offset + length
            word = int.from_bytes(self.bridge.sram[end - 4 : end], "little") ^ 0x00FF_0000
            self.bridge.sram[end - 4 : end] = word.to_bytes(4, "little")
        self.notify()

    def register_kernel(
        self, kernel_id: int, fn: Callable[..., object], duration: float = 0.0
    ) -> None:
        """``fn(gpu, *args)`` runs on a DISPATCH of ``kernel_id``; args are the packet's u64s."""
        self.kernels[kernel_id] = Kernel(fn, duration)

    # -- running -------------------------------------------------------------------------------

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Run the engines and firmware timers until cancelled."""
        async with anyio.create_task_group() as tg:
            self._tg = tg
            tg.start_soon(self.copy.run)
            tg.start_soon(self.compute.run)
            task_status.started()

    def later(self, delay: float, fn: Callable[..., object], *args: Any) -> None:
        """Call ``fn(*args)`` after ``delay`` simulated seconds, unless the GPU resets first."""
        if self._tg is None:
            return  # not running: firmware is silent
        scope = anyio.CancelScope()
        self._timers.add(scope)

        async def fire() -> None:
            try:
                with scope:
                    if delay > 0:
                        await anyio.sleep(delay)
                    fn(*args)
            finally:
                self._timers.discard(scope)

        self._tg.start_soon(fire)

    def notify(self) -> None:
        """Memory changed: wake engines waiting on a poll."""
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    async def memory_changed(self) -> None:
        if self._changed is None:
            self._changed = anyio.Event()
        await self._changed.wait()

    # -- memory --------------------------------------------------------------------------------

    def _vram_offset(self, address: int, size: int) -> int | None:
        offset = address - hw.VRAM_BASE
        if 0 <= offset and offset + size <= len(self.vram):
            return offset
        return None

    def read(self, address: int, size: int) -> memoryview:
        """A GPU read at a bus address: VRAM, or bridge memory over PCIe."""
        offset = self._vram_offset(address, size)
        if offset is not None:
            return self._vram_view[offset : offset + size]
        if self.bridge is None:
            raise LookupError(f"no memory at 0x{address:x}")
        return self.bridge.dma_read(address, size)

    def write(self, address: int, data: bytes | memoryview) -> None:
        offset = self._vram_offset(address, len(data))
        if offset is not None:
            self._vram_view[offset : offset + len(data)] = data
        elif self.bridge is not None:
            self.bridge.dma_write(address, data)
        else:
            raise LookupError(f"no memory at 0x{address:x}")
        self.notify()

    def view(self, address: int, size: int) -> np.ndarray:
        """VRAM at a bus address as a writable uint8 array (for kernels)."""
        offset = self._vram_offset(address, size)
        if offset is None:
            raise LookupError(f"0x{address:x}+{size} is not in VRAM")
        return np.frombuffer(self.vram, dtype=np.uint8, count=size, offset=offset)

    def bridge_sram(self, address: int) -> bytes:
        """The first dword of a firmware image the PSP is told to load (it sits in bridge SRAM)."""
        try:
            return bytes(self.read(address, 4))
        except LookupError:
            return bytes(4)

    def write_status(self, field: int, value: int) -> None:
        self.write(self.status_address + field, struct.pack("<I", value & 0xFFFF_FFFF))

    # -- PcieTarget ----------------------------------------------------------------------------

    def config_read(self, bus: int, device: int, function: int, register: int) -> int:
        if (bus, device, function) != (hw.GPU_BUS, hw.GPU_DEVICE, hw.GPU_FUNCTION):
            raise LookupError(f"nothing at {bus}:{device}.{function}")
        return hw.GPU_ID if register == 0 else self.registers.get(-register - 1, 0)

    def config_write(
        self, bus: int, device: int, function: int, register: int, value: int, byte_enables: int
    ) -> None:
        if (bus, device, function) != (hw.GPU_BUS, hw.GPU_DEVICE, hw.GPU_FUNCTION):
            raise LookupError(f"nothing at {bus}:{device}.{function}")
        self.registers[-register - 1] = value  # config space is kept apart (negative keys)

    def memory_read(self, address: int, size: int) -> bytes:
        offset = address - hw.MMIO_BASE
        if 0 <= offset < hw.MMIO_SIZE:
            word = self.read_register(offset & ~3).to_bytes(4, "little")
            return word[offset & 3 : (offset & 3) + size]
        if self._vram_offset(address, size) is None:
            raise LookupError(f"nothing claims 0x{address:x}")
        return bytes(self.read(address, size))

    def memory_write(self, address: int, data: bytes) -> None:
        offset = address - hw.MMIO_BASE
        if 0 <= offset < hw.MMIO_SIZE:
            if len(data) != 4 or offset & 3:
                raise LookupError(f"registers take aligned dwords (0x{offset:x}, {len(data)})")
            self.write_register(offset, int.from_bytes(data, "little"))
            return
        if self._vram_offset(address, len(data)) is None:
            raise LookupError(f"nothing claims 0x{address:x}")
        self.write(address, data)

    # -- registers -----------------------------------------------------------------------------

    def _queue(self, offset: int) -> QueueEngine | None:
        for queue in (self.copy, self.compute):
            if queue.block <= offset < queue.block + _QUEUE_SPAN:
                return queue
        return None

    def read_register(self, offset: int) -> int:
        queue = self._queue(offset)
        if queue is not None:
            return queue.read_register(offset - queue.block)
        if offset in self.smu.registers:
            return self.smu.registers[offset]
        if offset in self.psp.registers:
            return self.psp.registers[offset]
        if offset == hw.VRAM_SIZE_MB:
            return len(self.vram) >> 20
        if offset == hw.IH_WPTR:
            return self.ih_wptr
        if offset == hw.IH_RPTR:
            return self.ih_rptr
        if hw.IH_ENTRY <= offset < hw.IH_ENTRY + 4 * hw.IH_ENTRIES:
            slot = (offset - hw.IH_ENTRY) // 4  # interrupt i sits in slot i % IH_ENTRIES
            age = (self.ih_wptr - 1 - slot) % hw.IH_ENTRIES
            return int(self.interrupts[-1 - age][0]) if age < len(self.interrupts) else 0
        return self.registers.get(offset, 0)

    def write_register(self, offset: int, value: int) -> None:
        queue = self._queue(offset)
        if queue is not None:
            queue.write_register(offset - queue.block, value)
        elif offset in self.smu.registers:
            self.smu.write(offset, value)
        elif offset in self.psp.registers:
            self.psp.write(offset, value)
        elif offset == hw.IH_RPTR:
            self.ih_rptr = value
        elif offset == hw.IH_CNTL:
            if value & 2:  # clear the error state (after the host scanned the ring)
                self.error = 0
                self.write_status(hw.STATUS_ERROR, 0)
        elif offset != hw.VRAM_SIZE_MB:
            self.registers[offset] = value

    # -- faults, resets, power -----------------------------------------------------------------

    def interrupt(self, source: hw.Interrupt, detail: str = "") -> None:
        self.interrupts.append((source, detail))
        self.ih_wptr += 1
        if source.is_error:
            self.error = int(source)
            if source is hw.Interrupt.UTCL2_FAULT:
                self.registers[hw.VM_FAULT_STATUS] = 1
            self.write_status(hw.STATUS_ERROR, int(source))

    def firmware_loaded(self, command: int, argument: int) -> bool:
        """The PSP carried out ``command``; False for one it cannot (no such firmware)."""
        if command == hw.PspCommand.LOAD_IP_FW:
            if argument not in set(hw.Firmware):
                return False
            self.firmware.append(hw.Firmware(argument))
            if argument == hw.Firmware.SMU:
                self.smu.loaded = True
        return True

    def _reset_blocks(self) -> None:
        for scope in self._timers:
            scope.cancel()
        self.smu.reset()
        self.psp.reset()
        for queue in (self.copy, self.compute):
            queue.reset()
            queue.enabled = False
        self.interrupts.clear()
        self.ih_wptr = self.ih_rptr = 0
        self.error = 0
        self.firmware.clear()
        self.registers.pop(hw.VM_FAULT_STATUS, None)

    def mode1_reset(self) -> None:
        """An SMU mode-1 reset: firmware, queues and error state back to power-on (VRAM kept)."""
        self._reset_blocks()

    def power(self, on: bool) -> None:
        if on:
            return
        self._reset_blocks()
        self.registers.clear()  # scratch registers included: the next boot is a full one
        self._clear_vram()
        self.notify()

    def _clear_vram(self) -> None:
        if sys.platform.startswith("linux"):  # private anonymous pages read as zeros again
            self.vram.madvise(mmap.MADV_DONTNEED)
        else:
            self.vram[:] = bytes(len(self.vram))


class SimDevice:
    """A simulated bridge with a GPU behind it and their fault plan; the GPU's engines run on the
    current event loop while the device is open (``async with``). Construct it on that loop."""

    def __init__(
        self,
        *,
        plan: FaultPlan | None = None,
        vram_size: int = 64 << 20,
        link_latency: float = 0.0,
        firmware_latency: float = 0.0,
    ) -> None:
        self.plan = plan if plan is not None else FaultPlan()
        self.gpu = SimGpu(self.plan, vram_size=vram_size, firmware_latency=firmware_latency)
        self.bridge = SimBridge(self.gpu, plan=self.plan, link_latency=link_latency)
        self.gpu.attach(self.bridge)
        self._tg: anyio.abc.TaskGroup | None = None

    async def __aenter__(self) -> SimDevice:
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        await self._tg.start(self.gpu.run)
        return self

    async def __aexit__(self, *exc_info: *ExcInfo) -> bool | None:
        assert self._tg is not None
        self._tg.cancel_scope.cancel()
        return await self._tg.__aexit__(*exc_info)
