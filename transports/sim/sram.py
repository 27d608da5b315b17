"""The simulated bridge's SRAM DMA engine: 512 KiB of SRAM, and the arms (``ARM_SRAM`` requests)
queued ahead of the bulk transfers they pair with (spec hardware-waits §4.4).

Up to :data:`MAX_ARMS` arms queue, in order. An armed write takes the next bulk OUT into SRAM; an
armed read answers the next bulk IN, but only once the GPU has released it — by writing 0 to the
cq page's dword +12 — and a release may come before the bulk IN does (a release with no read armed
releases nothing). A transfer that does not fit its arm is refused, and so is an arm that does not
fit the SRAM or the slots it reserves.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from ..protocol.bridge import SECTOR, SLOT, SRAM_SIZE, VendorRequest, unpack_arm
from .pcie import Refused

__all__ = ["MAX_ARMS", "SramEngine"]

MAX_ARMS = 4
"""How many arms the engine queues ahead of their bulk transfers."""


@dataclass(eq=False)
class _Arm:
    read: bool
    offset: int
    length: int
    released: bool = False


class SramEngine:
    """The SRAM (:attr:`sram`, which the GPU also reaches over PCIe) and the queue of arms."""

    def __init__(self) -> None:
        self.sram = bytearray(SRAM_SIZE)
        self._arms: deque[_Arm] = deque()

    def arm(self, value: int, index: int) -> None:
        """Queue an ``ARM_SRAM`` request (its ``wValue`` and ``wIndex``)."""
        arm = unpack_arm(value, index)
        offset, length = arm.slot * SLOT, arm.sectors * SECTOR
        if not arm.sectors or offset + length > SRAM_SIZE or length > arm.slots * SLOT:
            raise Refused(
                f"0x{VendorRequest.ARM_SRAM:X} arm of {arm.sectors} sectors at slot {arm.slot} "
                f"({arm.slots} slots) does not fit"
            )
        if len(self._arms) >= MAX_ARMS:
            raise Refused(
                f"0x{VendorRequest.ARM_SRAM:X} arm with {MAX_ARMS} transfers already armed"
            )
        self._arms.append(_Arm(arm.read, offset, length))

    def armed(self, *, read: bool) -> bool:
        """Whether the oldest arm is one for a transfer in that direction."""
        return bool(self._arms) and self._arms[0].read == read

    def write(self, data: bytes | bytearray | memoryview, accepted: int) -> int:
        """A bulk OUT of ``data`` for the oldest arm (a write), of which the first ``accepted``
        bytes arrive; where in SRAM they landed."""
        arm = self._arms.popleft()
        view = memoryview(data).cast("B")
        if len(view) != arm.length:
            raise Refused(f"bulk OUT of {len(view)} bytes for an SRAM write armed for {arm.length}")
        # through a memoryview: a bytearray's own slice assignment copies the source first
        memoryview(self.sram)[arm.offset : arm.offset + accepted] = view[:accepted]
        return arm.offset

    def read(self, length: int) -> bytes | None:
        """A bulk IN of ``length`` bytes for the oldest arm (a read): its data, or None while the
        GPU has not released it."""
        arm = self._arms[0]
        if length != arm.length:
            self._arms.popleft()
            raise Refused(f"bulk IN of {length} bytes for an SRAM read armed for {arm.length}")
        if not arm.released:
            return None  # the GPU's write to the cq page releases it
        self._arms.popleft()
        return bytes(memoryview(self.sram)[arm.offset : arm.offset + arm.length])

    def release(self) -> bool:
        """The GPU released the oldest read armed and not yet released; whether there was one."""
        for arm in self._arms:  # only an armed read can be released
            if arm.read and not arm.released:
                arm.released = True
                return True
        return False

    def drop(self) -> None:
        """The transfer the oldest arm was for was discarded: the engine drops the arm."""
        self._arms.popleft()

    def clear(self) -> None:
        """Forget every arm (a USB reset, an unplug)."""
        self._arms.clear()
