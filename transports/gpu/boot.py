"""Booting the GPU: the blocks in the order SOC, GMC, IH, PSP, SMU, GFX, SDMA (spec §5.4), a full
boot or a partial one as the scratch registers say, PSP and SMU through bounded mailboxes.

:func:`boot` brings the PCIe link up (bounded), checks the GPU answers, boots it — marking
readiness layers as stages complete — and returns the :class:`BootedDevice` a session takes over.

Partial boot when SCRATCH_REG7 holds this driver's version stamp, SCRATCH_REG6 is 0 (the previous
session ended cleanly) and the VM protection-fault status is clear; otherwise full (and always
full on a device in its error state). A full boot on a GPU whose firmware already runs (PSP sOS
alive and the SMU answering) first mode-1 resets it.

The SMU's messages go through :mod:`transports.gpu.smu` (re-sent while unanswered).
:func:`bridge_answers` is the cheap liveness check a supervisor probes with between boots.
"""

from __future__ import annotations

import enum
import functools
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from aio_runtime import (
    DeviceLost,
    FirmwareError,
    FirmwareTimeout,
    Layer,
    Mailbox,
    RangeAllocator,
    Readiness,
    ReadinessLayer,
    RuntimeFault,
    get_logger,
    pause,
    wait_until,
)

from ..bridge import BridgeClient
from ..protocol import gpu as hw
from ..protocol.bridge import EP_BULK_OUT, SRAM_PCIE
from ..usb import UsbTransport
from .config import (
    COMPUTE_RING,
    HEAP_OFFSET,
    PSP_COMMANDS,
    PSP_FENCE,
    PSP_RING,
    RING_SIZE,
    SDMA_RING,
    SessionConfig,
)
from .copy import CopyProtocol
from .queues import Ring
from .smu import FIRMWARE_POLICY, send_smu, smu_answers, smu_mailbox

__all__ = [
    "BLOCKS",
    "BootLog",
    "BootMode",
    "BootedDevice",
    "BridgeRegisters",
    "Psp",
    "boot",
    "boot_mode",
    "bridge_answers",
    "scan_interrupts",
]

BLOCKS = ("SOC", "GMC", "IH", "PSP", "SMU", "GFX", "SDMA")
_log = get_logger(__name__)


class BridgeRegisters:
    """The GPU's MMIO registers (dword index = byte offset / 4) through the bridge: the core's
    :class:`aio_runtime.RegisterFile`."""

    def __init__(self, bridge: BridgeClient) -> None:
        self.bridge = bridge

    async def read(self, index: int) -> int:
        return await self.bridge.mem_read(hw.MMIO_BASE + 4 * index)

    async def write(self, index: int, value: int) -> None:
        await self.bridge.mem_write(hw.MMIO_BASE + 4 * index, value)


class BootMode(enum.StrEnum):
    FULL = "full"
    """Firmware loaded, every block programmed."""
    PARTIAL = "partial"
    """The firmware of the previous, cleanly ended session still runs: queues reset only."""


@dataclass
class BootLog:
    """What a boot did, in order: for the caller's logs and for tests."""

    mode: BootMode = BootMode.FULL
    steps: list[str] = field(default_factory=list)

    def step(self, block: str, what: str) -> None:
        self.steps.append(f"{block}: {what}")


async def boot_mode(regs: BridgeRegisters) -> BootMode:
    stamp = await regs.read(hw.SCRATCH_REG7 // 4)
    in_use = await regs.read(hw.SCRATCH_REG6 // 4)
    fault = await regs.read(hw.VM_FAULT_STATUS // 4)
    clean = stamp == hw.AM_VERSION and in_use == 0 and fault == 0
    return BootMode.PARTIAL if clean else BootMode.FULL


async def scan_interrupts(regs: BridgeRegisters) -> list[int]:
    """The interrupt sources since the last scan (the ring keeps the last 64); acknowledged."""
    wptr = await regs.read(hw.IH_WPTR // 4)
    rptr = await regs.read(hw.IH_RPTR // 4)
    sources = [
        await regs.read((hw.IH_ENTRY + 4 * (i % hw.IH_ENTRIES)) // 4)
        for i in range(max(rptr, wptr - hw.IH_ENTRIES), wptr)
    ]
    await regs.write(hw.IH_RPTR // 4, wptr)
    return sources


async def bridge_answers(usb: UsbTransport, *, timeout: float) -> bool:
    """Whether the bridge behind ``usb`` answers one read of its link-state byte within
    ``timeout``: a liveness check that costs one control transfer and needs neither the PCIe
    link nor a session. False when it does not answer in time (or answers with an error);
    :class:`~aio_runtime.DeviceLost` when the transport is closed or its device went away (no
    answer will ever come over it: open a new one)."""
    try:
        await BridgeClient(usb, control_timeout=timeout).link_state()
    except DeviceLost:
        raise
    except RuntimeFault:
        return False
    return True


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
            policy=FIRMWARE_POLICY,
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
            policy=FIRMWARE_POLICY,
        )
        status = await self.bridge.mem_read(self.commands + hw.PSP_RESPONSE_OFFSET)
        if status:
            raise FirmwareError(
                f"PSP command {what} failed with status 0x{status:x}",
                code=status,
                awaited=f"PSP response to {what}",
            )
        log.steps.append(f"PSP {what}")


@dataclass
class BootedDevice:
    """A GPU that has booted, as a session takes it over: its registers, its status page (the
    compute timeline, the error word, ``usb_go``), the VRAM heap, the compute queue, the copy
    protocol on the copy queue, and what the boot did."""

    regs: BridgeRegisters
    status: int
    heap: RangeAllocator
    compute: Ring
    copy: CopyProtocol
    log: BootLog


async def boot(bridge: BridgeClient, config: SessionConfig, readiness: Readiness) -> BootedDevice:
    """Boot the GPU behind ``bridge``, every wait bounded by ``config``; ``readiness`` gets
    ``DEVICE_ONLINE``, ``FIRMWARE_READY`` and ``QUEUE_SUBMITTABLE`` as the stages complete."""
    regs, log = BridgeRegisters(bridge), BootLog()
    await bridge.bring_up_link(timeout=config.link_timeout)
    ident = await bridge.config_read(hw.GPU_BUS, hw.GPU_DEVICE, hw.GPU_FUNCTION, 0)
    if ident != hw.GPU_ID:
        raise DeviceLost(
            f"no GPU behind the bridge (config id 0x{ident:08x}, expected 0x{hw.GPU_ID:08x})",
            layer=Layer.PCIE_REQUEST,
        )
    vram = (await regs.read(hw.VRAM_SIZE_MB // 4)) << 20  # discovery
    status = hw.VRAM_BASE + vram - hw.STATUS_PAGE_SIZE
    error = await bridge.mem_read(status + hw.STATUS_ERROR)
    log.mode = BootMode.FULL if error else await boot_mode(regs)  # an error state: boot afresh
    log.step("SOC", f"GPU 0x{ident:08x}, {log.mode} boot")
    readiness.mark_up(ReadinessLayer.DEVICE_ONLINE)
    log.step("readiness", "device_online")

    heap = RangeAllocator(
        vram - HEAP_OFFSET - hw.STATUS_PAGE_SIZE, base=hw.VRAM_BASE + HEAP_OFFSET, name="VRAM heap"
    )
    await bridge.write_stream(status, bytes(16))
    log.step("GMC", f"{vram >> 20} MiB VRAM, heap {heap.capacity >> 20} MiB")

    await scan_interrupts(regs)
    await regs.write(hw.IH_CNTL // 4, 2)
    log.step("IH", "ring acknowledged, error state clear")

    smu = smu_mailbox(regs, config.firmware_timeout)
    if log.mode is BootMode.FULL:
        await _full_boot(bridge, regs, smu, config, log)
    else:
        await _partial_boot(smu, config, log)
    readiness.mark_up(ReadinessLayer.FIRMWARE_READY)
    log.step("readiness", "firmware_ready")

    compute = Ring(
        bridge,
        hw.COMPUTE,
        hw.VRAM_BASE + COMPUTE_RING,
        config.compute_ring_size,
        "compute",
        timeout=config.kernel_timeout,
    )
    await compute.setup()
    log.step("GFX", "compute queue " + ("programmed" if log.mode is BootMode.FULL else "reset"))

    copy_ring = Ring(bridge, hw.SDMA, hw.VRAM_BASE + SDMA_RING, RING_SIZE, "copy")
    await copy_ring.setup()
    await regs.write(hw.SDMA_WATCHDOG // 4, config.copy_watchdog_ms)
    copy = CopyProtocol(
        bridge,
        copy_ring,
        usb_go=status + hw.STATUS_USB_GO,
        status=status,
        bulk_timeout=config.bulk_timeout,
        fence_timeout=config.fence_timeout,
    )
    await copy.restore()
    log.step("SDMA", "copy queue programmed")

    await regs.write(hw.SCRATCH_REG7 // 4, hw.AM_VERSION)
    await regs.write(hw.SCRATCH_REG6 // 4, 1)
    readiness.mark_up(ReadinessLayer.QUEUE_SUBMITTABLE)
    log.step("readiness", "queue_submittable")
    _log.info("gpu booted", mode=log.mode, steps=len(log.steps))
    return BootedDevice(regs, status, heap, compute, copy, log)


async def _full_boot(
    bridge: BridgeClient,
    regs: BridgeRegisters,
    smu: Mailbox,
    config: SessionConfig,
    log: BootLog,
) -> None:
    """PSP and SMU from scratch: a mode-1 reset first if firmware runs, the sOS (unless it runs),
    the PSP ring, the firmware of every block, then the SMU's driver table and features."""
    psp = Psp(
        bridge,
        regs,
        ring=hw.VRAM_BASE + PSP_RING,
        commands=hw.VRAM_BASE + PSP_COMMANDS,
        fence=hw.VRAM_BASE + PSP_FENCE,
        timeout=config.firmware_timeout,
        stage_image=functools.partial(_stage_image, bridge, config.bulk_timeout),
    )
    if await psp.sos_alive() and await smu_answers(smu, config.smu_probe_timeout):
        await regs.write(hw.SMU_MSG // 4, hw.SmuMessage.MODE1_RESET)
        await pause(config.mode1_reset_pause)
        log.step("SOC", "mode-1 reset (firmware was running)")
    if await psp.sos_alive():
        log.step("PSP", "sOS already running")
    else:
        await psp.load_sos(log)
    await psp.create_ring(log)
    await psp.submit(hw.PspCommand.LOAD_TOC, 0, log)
    await psp.submit(hw.PspCommand.SETUP_TMR, 0, log)
    for firmware in hw.Firmware:
        await psp.submit(hw.PspCommand.LOAD_IP_FW, firmware, log)
    log.step("PSP", "firmware loaded")
    table = hw.VRAM_BASE + PSP_FENCE + 0x1000
    await send_smu(smu, config, hw.SmuMessage.DRIVER_TABLE_HIGH, table >> 32)
    await send_smu(smu, config, hw.SmuMessage.DRIVER_TABLE_LOW, table & 0xFFFF_FFFF)
    await send_smu(smu, config, hw.SmuMessage.ENABLE_ALL_FEATURES)
    log.step("SMU", "features enabled")


async def _partial_boot(smu: Mailbox, config: SessionConfig, log: BootLog) -> None:
    """The firmware still runs: check the SMU answers."""
    log.step("PSP", "sOS running (partial boot)")
    await send_smu(smu, config, hw.SmuMessage.TEST)
    log.step("SMU", "answering (partial boot)")


async def _stage_image(bridge: BridgeClient, timeout: float, component: int) -> int:
    """A firmware component's image, staged in bridge SRAM for the PSP bootloader."""
    image = bytearray(0x4000)
    image[:4] = component.to_bytes(4, "little")
    async with bridge.out_pipe.hold("a firmware image"):
        await bridge.arm_sram(read=False, slot=0, length=len(image))
        await bridge.usb.bulk_out(EP_BULK_OUT, image, timeout=timeout)
    return SRAM_PCIE
