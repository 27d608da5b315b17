"""Host side of the GPU's queues: packet builders and the rings they are written into.

A :class:`Ring` lives in VRAM; :meth:`Ring.submit` writes packets at the write pointer with one
streaming write (two where they wrap) and rings the doorbell — the write-pointer register — with a
posted write. Packet formats: :mod:`transports.protocol.gpu`.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from aio_runtime import Layer, SignalTimeout, wait_until

from ..bridge import BridgeClient
from ..protocol import gpu as hw

__all__ = ["Packets", "Ring"]


_WORDS = [struct.Struct(f"<{count}I") for count in range(7)]
"""Packers of a packet's little-endian dwords, by count (a copy builds four packets per chunk; a
dispatch with many arguments has a packer made for it)."""


class Packets:
    """A packet stream under construction."""

    __slots__ = ("data",)

    def __init__(self) -> None:
        self.data = bytearray()

    def _put(self, *words: int) -> Packets:
        count = len(words)
        packer = _WORDS[count] if count < len(_WORDS) else struct.Struct(f"<{count}I")
        self.data += packer.pack(*words)
        return self

    def poll(self, address: int, value: int, *, equal: bool, mask: int = 0xFFFF_FFFF) -> Packets:
        function = hw.POLL_EQUAL if equal else hw.POLL_GREATER_EQUAL
        return self._put(hw.Sdma.POLL | function << 8, *hw.pack_u64(address), value, mask)

    def copy(self, source: int, target: int, size: int) -> Packets:
        return self._put(hw.Sdma.COPY, *hw.pack_u64(source), *hw.pack_u64(target), size)

    def write(self, address: int, value: int) -> Packets:
        return self._put(hw.Sdma.WRITE, *hw.pack_u64(address), value & 0xFFFF_FFFF)

    def fence(self, address: int, value: int) -> Packets:
        return self._put(hw.Sdma.FENCE, *hw.pack_u64(address), value & 0xFFFF_FFFF)

    def wait(self, address: int, value: int) -> Packets:
        """Compute queue: wait until the dword at ``address`` is >= ``value`` (32-bit compare)."""
        return self._put(
            hw.Pm4.WAIT | hw.POLL_GREATER_EQUAL << 8,
            *hw.pack_u64(address),
            value & 0xFFFF_FFFF,
            0xFFFF_FFFF,
        )

    def dispatch(self, kernel: int, args: list[int]) -> Packets:
        if len(args) > 0xFF:
            raise ValueError(f"a dispatch takes at most 255 arguments, got {len(args)}")
        words = [w for arg in args for w in hw.pack_u64(arg)]
        return self._put(hw.Pm4.DISPATCH | len(args) << 8, kernel, *words)

    def release(self, address: int, value: int) -> Packets:
        return self._put(hw.Pm4.RELEASE, *hw.pack_u64(address), value & 0xFFFF_FFFF)


_MASK = 0xFFFF_FFFF


@dataclass(eq=False, repr=False)
class Ring:
    """One queue's ring buffer in VRAM (``size`` bytes at bus address ``base``) and its register
    block (``block``, from the MMIO base).

    The write and read pointers are 32-bit byte counts that wrap; the ring's size is a power of
    two, so a pointer modulo the size is its place in the ring. :meth:`submit` never overwrites
    packets the engine has not read: when the ring is full it waits (bounded by ``timeout``:
    :class:`aio_runtime.SignalTimeout`) for the read pointer to move.
    """

    bridge: BridgeClient
    block: int
    base: int
    size: int
    name: str
    timeout: float = field(default=10.0, kw_only=True)
    wptr: int = field(default=0, init=False)
    _rptr: int = field(default=0, init=False)
    """The engine's read pointer when last read."""

    def __post_init__(self) -> None:
        size = self.size
        if size < 64 or size & (size - 1) or size > 1 << 31:
            raise ValueError(f"a ring's size is a power of two from 64 bytes to 2 GiB, got {size}")

    def _register(self, offset: int) -> int:
        return hw.MMIO_BASE + self.block + offset

    async def setup(self) -> None:
        """Program the ring and enable the queue from an empty state."""
        for offset, value in (
            (hw.RB_CNTL, hw.CNTL_RESET),
            (hw.RB_LO, self.base & 0xFFFF_FFFF),
            (hw.RB_HI, self.base >> 32),
            (hw.RB_SIZE, self.size),
            (hw.RB_CNTL, hw.CNTL_ENABLE),
        ):
            await self.bridge.mem_write(self._register(offset), value)
        self.wptr = self._rptr = 0

    async def reset(self) -> None:
        """Stop the queue wherever it is, empty its ring and start it again."""
        await self.bridge.mem_write(self._register(hw.RB_CNTL), hw.CNTL_RESET | hw.CNTL_ENABLE)
        self.wptr = self._rptr = 0

    async def read(self, offset: int) -> int:
        return await self.bridge.mem_read(self._register(offset))

    async def submit(self, packets: Packets, *, timeout: float | None = None) -> None:
        """Write ``packets`` and ring the doorbell; waiting for ring space is bounded by
        ``timeout`` (default: the ring's)."""
        data = memoryview(packets.data)
        if len(data) > self.size:
            raise ValueError(f"{len(data)} bytes of packets do not fit the {self.size}-byte ring")
        if (self.wptr + len(data) - self._rptr) & _MASK > self.size:
            self._rptr = await wait_until(
                lambda: self.read(hw.RB_RPTR),
                lambda rptr: (self.wptr + len(data) - rptr) & _MASK <= self.size,
                awaited=f"{self.name} ring space for {len(data)} bytes",
                error=SignalTimeout,
                layer=Layer.GPU_QUEUE,
                timeout=self.timeout if timeout is None else timeout,
            )
        start = self.wptr % self.size
        first = min(len(data), self.size - start)
        await self.bridge.write_stream(self.base + start, data[:first])
        if first < len(data):
            await self.bridge.write_stream(self.base, data[first:])
        wptr = (self.wptr + len(data)) & _MASK
        await self.bridge.mem_write(self._register(hw.RB_WPTR), wptr)
        self.wptr = wptr  # only once the doorbell rang: a failed submit leaves nothing queued
