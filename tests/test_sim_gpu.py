"""The simulated GPU on its own: engines that react to writes, the watchdog, resets, firmware."""

from __future__ import annotations

import struct

import anyio
import anyio.lowlevel
import pytest
from gpu_sim import ADD_ONE, SLOW, SLOW_ADD_ONE, device

from aio_runtime import now
from aio_runtime.testing import virtual_time
from transports.gpu.queues import Packets
from transports.protocol import gpu as hw
from transports.protocol.bridge import SRAM_PCIE
from transports.sim import Fault, FaultRule

pytestmark = pytest.mark.anyio

RING = hw.VRAM_BASE + 0x1000


def program(gpu, block: int, packets: Packets) -> None:
    """Write packets into a ring at RING and ring the doorbell, as the host would."""
    gpu.write(RING, bytes(packets.data))
    for offset, value in (
        (hw.RB_LO, RING & 0xFFFF_FFFF),
        (hw.RB_HI, RING >> 32),
        (hw.RB_SIZE, 0x1000),
        (hw.RB_CNTL, hw.CNTL_ENABLE),
        (hw.RB_WPTR, len(packets.data)),
    ):
        gpu.write_register(block + offset, value)


def u32(gpu, address: int) -> int:
    return struct.unpack("<I", gpu.read(address, 4))[0]


async def test_the_copy_engine_waits_on_a_poll_until_memory_changes_then_copies():
    async with virtual_time(), device() as sim:
        gpu = sim.gpu
        target, flag = hw.VRAM_BASE + 0x10000, SRAM_PCIE + 0x100
        packets = Packets().poll(flag, 7, equal=True).copy(SRAM_PCIE, target, 16)
        program(gpu, hw.SDMA, packets.fence(gpu.status_address + hw.STATUS_COPY_FENCE, 1))
        await anyio.sleep(3.0)
        assert gpu.copy.executed == 0  # still polling: nothing wrote the flag
        sim.bridge.sram[:16] = b"0123456789abcdef"
        written = now()
        gpu.write(flag, struct.pack("<I", 7))
        await anyio.lowlevel.checkpoint()
        await anyio.lowlevel.checkpoint()
        assert now() == written  # it reacted to the write, not to a timer
        assert bytes(gpu.read(target, 16)) == b"0123456789abcdef"
        assert u32(gpu, gpu.status_address + hw.STATUS_COPY_FENCE) == 1


async def test_the_watchdog_halts_a_poll_that_waits_too_long_and_a_reset_restarts():
    async with virtual_time(), device() as sim:
        gpu = sim.gpu
        gpu.write_register(hw.SDMA_WATCHDOG, 2000)
        program(gpu, hw.SDMA, Packets().poll(SRAM_PCIE, 1, equal=True))
        await anyio.sleep(1.9)
        assert not gpu.copy.halted
        await anyio.sleep(0.2)
        assert gpu.copy.halted
        assert gpu.interrupts[-1][0] is hw.Interrupt.SDMA_WATCHDOG
        assert gpu.read_register(hw.SDMA + hw.RB_STATUS) == hw.STATUS_HALTED
        gpu.write_register(hw.SDMA + hw.RB_CNTL, hw.CNTL_RESET | hw.CNTL_ENABLE)
        assert not gpu.copy.halted and gpu.copy.rptr == gpu.copy.wptr == 0


async def test_a_hung_kernel_holds_the_timeline_until_the_queue_is_reset():
    async with virtual_time(), device(FaultRule(Fault.KERNEL_HANG, at=1)) as sim:
        gpu = sim.gpu
        buffer = hw.VRAM_BASE + 0x20000
        timeline = gpu.status_address + hw.STATUS_TIMELINE
        program(
            gpu, hw.COMPUTE, Packets().dispatch(ADD_ONE, [buffer, buffer, 4]).release(timeline, 1)
        )
        await anyio.sleep(60)
        assert u32(gpu, timeline) == 0
        gpu.write_register(hw.COMPUTE + hw.RB_CNTL, hw.CNTL_RESET | hw.CNTL_ENABLE)
        program(
            gpu, hw.COMPUTE, Packets().dispatch(ADD_ONE, [buffer, buffer, 4]).release(timeline, 1)
        )
        await anyio.sleep(0.01)
        assert u32(gpu, timeline) == 1
        assert bytes(gpu.read(buffer, 4)) == b"\x01" * 4


async def test_an_interrupt_ring_fault_puts_the_device_in_its_error_state():
    async with virtual_time(), device(FaultRule(Fault.IH_FAULT, at=1)) as sim:
        gpu = sim.gpu
        timeline = gpu.status_address + hw.STATUS_TIMELINE
        program(gpu, hw.COMPUTE, Packets().dispatch(ADD_ONE, [RING, RING, 4]).release(timeline, 1))
        await anyio.sleep(0.01)
        assert gpu.error == hw.Interrupt.UTCL2_FAULT
        assert u32(gpu, gpu.status_address + hw.STATUS_ERROR) == hw.Interrupt.UTCL2_FAULT
        assert gpu.read_register(hw.VM_FAULT_STATUS) == 1
        assert gpu.read_register(hw.IH_WPTR) == 1
        assert gpu.read_register(hw.IH_ENTRY) == hw.Interrupt.UTCL2_FAULT
        assert u32(gpu, timeline) == 0
        gpu.write_register(hw.IH_CNTL, 2)
        assert gpu.error == 0


async def test_the_smu_answers_only_once_its_firmware_is_loaded_and_after_its_latency():
    async with virtual_time(), device(firmware_latency=0.01) as sim:
        gpu = sim.gpu
        gpu.write_register(hw.SMU_MSG, hw.SmuMessage.TEST)
        await anyio.sleep(1.0)
        assert gpu.read_register(hw.SMU_RESP) == 0  # nobody there yet
        gpu.firmware_loaded(hw.PspCommand.LOAD_IP_FW, hw.Firmware.SMU)
        gpu.write_register(hw.SMU_MSG, hw.SmuMessage.TEST)
        await anyio.sleep(0.005)
        assert gpu.read_register(hw.SMU_RESP) == 0
        await anyio.sleep(0.01)
        assert gpu.read_register(hw.SMU_RESP) == hw.SMU_OK


async def test_power_off_takes_everything_down():
    async with device() as sim:
        gpu = sim.gpu
        gpu.firmware_loaded(hw.PspCommand.LOAD_IP_FW, hw.Firmware.SMU)
        gpu.write_register(hw.SCRATCH_REG7, hw.AM_VERSION)
        gpu.write(hw.VRAM_BASE, b"data")
        gpu.power(False)
        assert gpu.read_register(hw.SCRATCH_REG7) == 0
        assert not gpu.smu.loaded
        assert bytes(gpu.read(hw.VRAM_BASE, 4)) == bytes(4)


async def test_a_queue_reset_in_the_instant_a_kernel_finishes_drops_it():
    async with virtual_time(), device() as sim:
        gpu = sim.gpu
        buffer = hw.VRAM_BASE + 0x20000
        timeline = gpu.status_address + hw.STATUS_TIMELINE
        packets = Packets().dispatch(SLOW_ADD_ONE, [buffer, buffer, 4]).release(timeline, 1)
        program(gpu, hw.COMPUTE, packets)
        await anyio.sleep(SLOW)  # the same instant the kernel's timer fires
        gpu.write_register(hw.COMPUTE + hw.RB_CNTL, hw.CNTL_RESET | hw.CNTL_ENABLE)
        await anyio.sleep(0.01)
        # Which came first in that instant is the scheduler's choice; either way the queue is
        # empty and healthy, and the kernel either finished before the reset or never ran.
        assert (gpu.compute.rptr, gpu.compute.wptr) == (0, 0)
        assert not gpu.compute.halted and gpu.error == 0
        ran = bytes(gpu.read(buffer, 4)) == b"\x01" * 4
        assert ran or bytes(gpu.read(buffer, 4)) == bytes(4)
        program(
            gpu, hw.COMPUTE, Packets().dispatch(ADD_ONE, [buffer, buffer, 4]).release(timeline, 2)
        )
        await anyio.sleep(0.01)
        assert u32(gpu, timeline) == 2 and gpu.compute.executed == 2
