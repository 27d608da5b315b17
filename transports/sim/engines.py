"""The simulated GPU's queues: the copy engine (SDMA) and the compute queue, each a ring of packets
(:mod:`transports.protocol.gpu`) that the engine executes in order. A packet that addresses memory
nothing claims raises a UTCL2 fault interrupt and halts the queue, as a GPU's page fault does.

An engine wakes when its doorbell (write pointer) is written and, while a POLL/WAIT packet is
unsatisfied, whenever memory it can see changes — it never polls on a timer, so a copy runs as
fast as the host feeds it. The copy engine's watchdog halts it when a poll waits longer than
``SDMA_WATCHDOG`` ms, raising an interrupt. Resetting a queue (control bit 1) stops whatever it is
doing at once and clears its pointers.

Faults: ``SENTINEL_NEVER_CONSUMED`` (a POLL on bridge SRAM never sees its value),
``COPY_WATCHDOG`` (the engine's watchdog fires at a poll), ``COPYOUT_RELEASE_NEVER`` (a WRITE to
the bridge's cq page is dropped), ``KERNEL_HANG`` (a dispatch never finishes), ``IH_FAULT`` (a
dispatch faults: a UTCL2 interrupt puts the device in its error state).
"""

from __future__ import annotations

import inspect
import math
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import anyio

from ..protocol import gpu as hw
from ..protocol.bridge import CQ_PCIE, CQ_SIZE, SRAM_PCIE, SRAM_SIZE
from .faults import Fault

if TYPE_CHECKING:
    from .gpu import SimGpu

__all__ = ["ComputeQueue", "CopyEngine", "Kernel", "QueueEngine"]


@dataclass
class Kernel:
    """A registered compute kernel: ``fn(gpu, *args)`` over VRAM (see :meth:`SimGpu.view`), taking
    ``duration`` seconds of simulated time. ``fn`` may return an awaitable (work that takes real
    time off the loop, such as a model run in a worker thread); the queue waits for it."""

    fn: Callable[..., object]
    duration: float = 0.0


_MASK = 0xFFFF_FFFF
"""Ring pointers are 32-bit byte counts that wrap (ring sizes are powers of two)."""
_DWORDS = [struct.Struct(f"<{count}I") for count in range(2 + 2 * 0xFF + 1)]
"""Unpackers of a packet's little-endian dwords, by count (every packet read takes one)."""
_SDMA_SIZES = {int(op): size for op, size in hw.SDMA_SIZES.items()}
_POLL, _COPY = int(hw.Sdma.POLL), int(hw.Sdma.COPY)


class _Halt(Exception):
    """The engine stops (watchdog, fault): only a reset restarts it."""


class QueueEngine:
    """A ring of packets behind a register block (base, size, write/read pointers, control)."""

    name = "queue"

    def __init__(self, gpu: SimGpu, block: int) -> None:
        self.gpu = gpu
        self.block = block
        self.base = 0
        self.size = 0
        self.wptr = 0
        self.rptr = 0
        self.enabled = False
        self.halted = False
        self.executed = 0
        """Packets executed since the last reset (for tests)."""
        self.generation = 0
        """Counts resets: a wait that returns into an older generation does nothing more."""
        self._wake = anyio.Event()
        self._scope: anyio.CancelScope | None = None

    # -- registers -----------------------------------------------------------------------------

    def read_register(self, offset: int) -> int:
        return {
            hw.RB_LO: self.base & 0xFFFF_FFFF,
            hw.RB_HI: self.base >> 32,
            hw.RB_SIZE: self.size,
            hw.RB_WPTR: self.wptr,
            hw.RB_RPTR: self.rptr,
            hw.RB_CNTL: int(self.enabled),
            hw.RB_STATUS: hw.STATUS_HALTED if self.halted else 0,
        }.get(offset, 0)

    def write_register(self, offset: int, value: int) -> None:
        if offset == hw.RB_LO:
            self.base = (self.base & ~0xFFFF_FFFF) | value
        elif offset == hw.RB_HI:
            self.base = (self.base & 0xFFFF_FFFF) | value << 32
        elif offset == hw.RB_SIZE:
            self.size = value
        elif offset == hw.RB_WPTR:
            self.wptr = value & _MASK
            self.poke()
        elif offset == hw.RB_CNTL:
            if value & hw.CNTL_RESET:
                self.reset()
            self.enabled = bool(value & hw.CNTL_ENABLE)
            self.poke()

    def reset(self) -> None:
        """Stop at once, forget the ring's contents (pointers to 0) and any halt. Work the
        engine was about to resume (woken in the same instant) is dropped too: it checks the
        reset generation after every wait."""
        self.generation += 1
        if self._scope is not None:
            self._scope.cancel()
        self.wptr = self.rptr = 0
        self.halted = False
        self.executed = 0

    def poke(self) -> None:
        self._wake.set()

    # -- execution -----------------------------------------------------------------------------

    async def run(self) -> None:
        while True:
            with anyio.CancelScope() as self._scope:
                try:
                    await self._execute()
                except _Halt:
                    self.halted = True
                    await anyio.sleep_forever()

    async def _execute(self) -> None:
        while True:
            pending = (self.wptr - self.rptr) & _MASK
            if not self.enabled or self.halted or self.size == 0 or pending == 0:
                await self._sleep()
                continue
            header = self._dword(self.rptr)
            length = self.packet_dwords(header & 0xFF, header >> 8)
            if length is None:
                self.gpu.interrupt(hw.Interrupt.SQ_ERROR, f"{self.name}: packet 0x{header:x}")
                raise _Halt(f"{self.name}: bad packet header 0x{header:x}")
            if 4 * length > pending:
                await self._sleep()  # the rest of the packet is not written yet
                continue
            words = self._dwords(self.rptr, length)
            generation = self.generation
            try:
                await self.execute(words)
            except (LookupError, ValueError) as exc:  # an address nothing claims, a bad field
                self.gpu.interrupt(hw.Interrupt.UTCL2_FAULT, f"{self.name}: {exc}")
                raise _Halt(str(exc)) from exc
            if generation != self.generation:
                return  # reset meanwhile: that packet belonged to a ring that is gone
            self.rptr = (self.rptr + 4 * length) & _MASK
            self.executed += 1

    async def _sleep(self) -> None:
        """Until the next poke (doorbell, control). The event is made only here, right after
        the check that found nothing to do: nothing can poke in between on this thread."""
        self._wake = anyio.Event()
        await self._wake.wait()

    def _dword(self, pointer: int) -> int:
        address = self.base + pointer % self.size
        return int.from_bytes(self.gpu.read(address, 4), "little")

    def _dwords(self, pointer: int, count: int) -> list[int]:
        start = pointer % self.size
        if start + 4 * count > self.size:  # the packet wraps around the ring's end
            return [self._dword(pointer + 4 * i) for i in range(count)]
        return list(_DWORDS[count].unpack(self.gpu.read(self.base + start, 4 * count)))

    def packet_dwords(self, opcode: int, argument: int) -> int | None:
        raise NotImplementedError

    async def execute(self, words: list[int]) -> None:
        raise NotImplementedError

    def met(self, address: int, value: int, mask: int, function: int) -> bool:
        """Whether the dword at ``address`` meets a POLL/WAIT packet's condition now."""
        word = int.from_bytes(self.gpu.read(address, 4), "little") & mask
        return word == value if function == hw.POLL_EQUAL else word >= value

    async def poll(self, address: int, value: int, mask: int, function: int) -> None:
        """Wait until the dword at ``address`` meets the condition, re-reading it whenever memory
        changes."""
        while not self.met(address, value, mask, function):
            await self.gpu.memory_changed()


def _u64(lo: int, hi: int) -> int:
    return hi << 32 | lo


class CopyEngine(QueueEngine):
    """The copy queue: POLL, COPY, WRITE, FENCE (spec §3.3 and §4.6)."""

    name = "copy engine"

    def __init__(self, gpu: SimGpu) -> None:
        super().__init__(gpu, hw.SDMA)
        self.watchdog_ms = 10_000

    def read_register(self, offset: int) -> int:
        if self.block + offset == hw.SDMA_WATCHDOG:
            return self.watchdog_ms
        return super().read_register(offset)

    def write_register(self, offset: int, value: int) -> None:
        if self.block + offset == hw.SDMA_WATCHDOG:
            self.watchdog_ms = value
        else:
            super().write_register(offset, value)

    def packet_dwords(self, opcode: int, argument: int) -> int | None:
        return _SDMA_SIZES.get(opcode)

    async def execute(self, words: list[int]) -> None:
        plan = self.gpu.plan
        op = words[0] & 0xFF
        if op == _POLL:
            address, value, mask = _u64(words[1], words[2]), words[3], words[4]
            if plan.check(Fault.COPY_WATCHDOG):
                self._watchdog()
            on_sram = SRAM_PCIE <= address < SRAM_PCIE + SRAM_SIZE
            never = on_sram and plan.check(Fault.SENTINEL_NEVER_CONSUMED) is not None
            function = words[0] >> 8
            if not never and self.met(address, value, mask, function):
                return  # met already: no wait, so no watchdog to arm
            limit = self.watchdog_ms / 1000 if self.watchdog_ms else math.inf
            generation = self.generation
            with anyio.move_on_after(limit):
                if never:
                    await anyio.sleep_forever()  # the engine never sees this sentinel
                await self.poll(address, value, mask, function)
                return
            if generation == self.generation:  # not reset in the same instant
                self._watchdog()
        elif op == _COPY:
            source, target, size = _u64(words[1], words[2]), _u64(words[3], words[4]), words[5]
            self.gpu.write(target, self.gpu.read(source, size))
        else:  # WRITE, FENCE: everything before has completed (the engine runs in order)
            address = _u64(words[1], words[2])
            released = CQ_PCIE <= address < CQ_PCIE + CQ_SIZE
            if released and plan.check(Fault.COPYOUT_RELEASE_NEVER):
                return
            self.gpu.write(address, struct.pack("<I", words[3]))
            if op == hw.Sdma.FENCE:
                self.gpu.write_status(hw.STATUS_COPY_FENCE, words[3])

    def _watchdog(self) -> None:
        self.gpu.interrupt(hw.Interrupt.SDMA_WATCHDOG)
        raise _Halt("copy engine watchdog")


class ComputeQueue(QueueEngine):
    """The compute queue: WAIT, DISPATCH of a registered kernel, RELEASE (the timeline)."""

    name = "compute queue"

    def __init__(self, gpu: SimGpu) -> None:
        super().__init__(gpu, hw.COMPUTE)

    def packet_dwords(self, opcode: int, argument: int) -> int | None:
        if opcode == hw.Pm4.WAIT:
            return 5
        if opcode == hw.Pm4.DISPATCH:
            return 2 + 2 * argument
        if opcode == hw.Pm4.RELEASE:
            return 4
        return None

    async def execute(self, words: list[int]) -> None:
        op = words[0] & 0xFF
        if self.gpu.error:
            raise _Halt("the device is in its error state")
        if op == hw.Pm4.WAIT:
            await self.poll(_u64(words[1], words[2]), words[3], words[4], words[0] >> 8)
        elif op == hw.Pm4.DISPATCH:
            await self._dispatch(
                words[1], [_u64(words[i], words[i + 1]) for i in range(2, len(words), 2)]
            )
        else:
            address = _u64(words[1], words[2])
            self.gpu.write(address, struct.pack("<I", words[3]))

    async def _dispatch(self, kernel_id: int, args: list[int]) -> None:
        plan = self.gpu.plan
        if plan.check(Fault.KERNEL_HANG):
            await anyio.sleep_forever()
        if plan.check(Fault.IH_FAULT):
            self.gpu.interrupt(hw.Interrupt.UTCL2_FAULT)
            raise _Halt("page fault")
        kernel = self.gpu.kernels.get(kernel_id)
        if kernel is None:
            self.gpu.interrupt(hw.Interrupt.SQ_ERROR)
            raise _Halt(f"no kernel {kernel_id}")
        if kernel.duration > 0:
            generation = self.generation
            await anyio.sleep(kernel.duration)
            if generation != self.generation:
                return  # the queue was reset while the kernel ran: it never finishes
        generation = self.generation
        try:
            result = kernel.fn(self.gpu, *args)
            if inspect.isawaitable(result):  # a kernel that takes real time (a model run)
                await result
        except Exception as exc:
            if generation == self.generation:
                self.gpu.interrupt(hw.Interrupt.SQ_ERROR, detail=repr(exc))
                raise _Halt(f"kernel {kernel_id} failed") from exc
