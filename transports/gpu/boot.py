"""Booting the GPU: the blocks in the order SOC, GMC, IH, PSP, SMU, GFX, SDMA (spec §5.4), a full
boot or a partial one as the scratch registers say, PSP and SMU through bounded mailboxes.

Partial boot when SCRATCH_REG7 holds this driver's version stamp, SCRATCH_REG6 is 0 (the previous
session ended cleanly) and the VM protection-fault status is clear; otherwise full. A full boot on
a GPU whose firmware already runs (PSP sOS alive and the SMU answering) first mode-1 resets it.
"""

from __future__ import annotations

import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from aio_runtime import (
    FirmwareError,
    FirmwareTimeout,
    Layer,
    Mailbox,
    MailboxLayout,
    PollPolicy,
    wait_until,
)

from ..bridge import BridgeClient
from ..protocol import gpu as hw

__all__ = ["BLOCKS", "BootLog", "BridgeRegisters", "Psp", "boot_mode"]

BLOCKS = ("SOC", "GMC", "IH", "PSP", "SMU", "GFX", "SDMA")
_FIRMWARE_POLICY = PollPolicy(spin=0, first_interval=0.0005, max_interval=0.01)


class BridgeRegisters:
    """The GPU's MMIO registers (dword index = byte offset / 4) through the bridge: the core's
    :class:`aio_runtime.RegisterFile`."""

    def __init__(self, bridge: BridgeClient) -> None:
        self.bridge = bridge

    async def read(self, index: int) -> int:
        return await self.bridge.mem_read(hw.MMIO_BASE + 4 * index)

    async def write(self, index: int, value: int) -> None:
        await self.bridge.mem_write(hw.MMIO_BASE + 4 * index, value)


@dataclass
class BootLog:
    """What a boot did, in order: for the caller's logs and for tests."""

    mode: str = ""
    steps: list[str] = field(default_factory=list)


async def boot_mode(regs: BridgeRegisters) -> str:
    stamp = await regs.read(hw.SCRATCH_REG7 // 4)
    in_use = await regs.read(hw.SCRATCH_REG6 // 4)
    fault = await regs.read(hw.VM_FAULT_STATUS // 4)
    return "partial" if stamp == hw.AM_VERSION and in_use == 0 and fault == 0 else "full"


def smu_mailbox(regs: BridgeRegisters, timeout: float) -> Mailbox:
    return Mailbox(
        regs,
        MailboxLayout(message=hw.SMU_MSG // 4, argument=hw.SMU_ARG // 4, response=hw.SMU_RESP // 4),
        name="SMU",
        timeout=timeout,
        success=hw.SMU_OK,
        policy=_FIRMWARE_POLICY,
        codes={0xFF: "failed", 0xFE: "unknown message", 0xFD: "command rejected"},
    )


class Psp:
    """The PSP: bootloader handshakes, the sOS, its ring (spec §5.3)."""

    def __init__(
        self,
        bridge: BridgeClient,
        regs: BridgeRegisters,
        *,
        ring: int,
        commands: int,
        fence: int,
        timeout: float,
        stage_image: Callable[[int], Awaitable[int]],
    ) -> None:
        self.bridge = bridge
        self.regs = regs
        self.ring = ring
        self.commands = commands
        self.fence = fence
        self.timeout = timeout
        self.stage_image = stage_image
        """Puts a component's image into the bridge SRAM; returns its bus address."""
        self._frames = 0

    async def _wait_register(self, offset: int, test: Callable[[int], bool], what: str) -> int:
        return await wait_until(
            lambda: self.regs.read(offset // 4),
            test,
            awaited=f"PSP {what}",
            error=FirmwareTimeout,
            layer=Layer.FIRMWARE,
            timeout=self.timeout,
            policy=_FIRMWARE_POLICY,
        )

    async def sos_alive(self) -> bool:
        return await self.regs.read(hw.PSP_SOS // 4) != 0

    async def load_sos(self, log: BootLog) -> None:
        for component in hw.PspComponent:
            await self._wait_register(
                hw.PSP_BL, lambda v: bool(v & hw.PSP_READY), "bootloader ready"
            )
            address = await self.stage_image(component)
            await self.regs.write(hw.PSP_BL_ADDR // 4, address >> 20)
            await self.regs.write(hw.PSP_BL // 4, component)
            log.steps.append(f"PSP load {component.name}")
        await self._wait_register(hw.PSP_SOS, lambda v: v != 0, "sOS alive")

    async def create_ring(self, log: BootLog) -> None:
        self._frames = 0
        await self.bridge.mem_write(self.fence, 0)  # a new ring's frames count from 1 again
        await self.regs.write(hw.PSP_RING_LO // 4, self.ring & 0xFFFF_FFFF)
        await self.regs.write(hw.PSP_RING_HI // 4, self.ring >> 32)
        await self.regs.write(hw.PSP_RING_SIZE // 4, 0x1000)
        await self.regs.write(hw.PSP_RING_WPTR // 4, 0)
        await self.regs.write(hw.PSP_RING_CTL // 4, 2)  # ring type: KM
        await self._wait_register(
            hw.PSP_RING_CTL,
            lambda v: v & 0x8000_FFFF == hw.PSP_RING_CREATED,
            "ring created",
        )
        log.steps.append("PSP ring created")

    async def submit(self, command: hw.PspCommand, argument: int, log: BootLog) -> None:
        """One ring submission: write the command and a frame, advance the write pointer, await
        the fence (bounded), then check the response status."""
        self._frames += 1
        value = self._frames
        slot = (self._frames - 1) % (0x1000 // hw.PSP_FRAME_SIZE)
        await self.bridge.write_stream(
            self.commands, struct.pack("<4I", command, argument, 0, 0xFFFF_FFFF)
        )
        frame = struct.pack(
            "<8I", *hw.pack_u64(self.commands), *hw.pack_u64(self.fence), value, 0, 0, 0
        )
        await self.bridge.write_stream(self.ring + slot * hw.PSP_FRAME_SIZE, frame)
        await self.regs.write(hw.PSP_RING_WPTR // 4, self._frames)
        what = f"{command.name} 0x{argument:x}"
        await wait_until(
            lambda: self.bridge.mem_read(self.fence),
            lambda v: v == value,
            awaited=f"PSP ring fence for {what}",
            error=FirmwareTimeout,
            layer=Layer.FIRMWARE,
            timeout=self.timeout,
            expected=value,
            policy=_FIRMWARE_POLICY,
        )
        status = await self.bridge.mem_read(self.commands + hw.PSP_RESPONSE_OFFSET)
        if status:
            raise FirmwareError(
                f"PSP command {what} failed with status 0x{status:x}",
                code=status,
                awaited=f"PSP response to {what}",
            )
        log.steps.append(f"PSP {what}")
