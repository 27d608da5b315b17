"""The simulated USB-PCIe bridge, driven the way a host drives it: vendor requests and bulk data."""

from __future__ import annotations

import math
import struct

import anyio
import pytest
from fake_pcie import FakeGpu

from aio_runtime import now
from aio_runtime.testing import virtual_time
from transports.sim import Fault, FaultPlan, FaultRule
from transports.sim.bridge import (
    CQ_RELEASE_PCIE,
    FENCE_XDATA,
    LINK_UP,
    LTSSM_XDATA,
    SLOT,
    SRAM_PCIE,
    SYS_PCIE,
    CompletionStatus,
    SimBridge,
    SimDeviceGone,
    SimTransferError,
)

pytestmark = pytest.mark.anyio

MWR32, MRD32, CFG_READ0, CFG_READ1 = 0x40, 0x00, 0x04, 0x05


def tlp(address: int, word: int) -> bytes:
    return struct.pack("<III", address & 0xFFFFFFFF, address >> 32, word)


def completion(raw: bytes) -> tuple[int, int, int]:
    data, status_byte, _, _, bridge_status = struct.unpack("<IBBBB", raw)
    return data, status_byte >> 5, bridge_status


async def powered(bridge: SimBridge) -> SimBridge:
    await bridge.control_out(0xF3, 1, 0, b"")
    return bridge


async def test_controller_memory_is_written_a_byte_at_a_time_and_read_in_blocks():
    bridge = SimBridge(FakeGpu())
    for i, byte in enumerate(b"\x01\x02\x03"):
        await bridge.control_out(0xE5, FENCE_XDATA + i, byte, b"")
    assert await bridge.control_in(0xE4, FENCE_XDATA, 0, 4) == b"\x01\x02\x03\x00"
    with pytest.raises(SimTransferError):
        await bridge.control_in(0xE4, 0, 0, 0x100)  # at most 0xFF bytes per request


async def test_the_link_comes_up_after_power_on_and_its_latency():
    bridge = SimBridge(FakeGpu(), link_latency=0.2)
    async with virtual_time():
        assert (await bridge.control_in(0xE4, LTSSM_XDATA, 0, 1))[0] == 0
        await bridge.control_out(0xF3, 1, 0, b"")
        assert (await bridge.control_in(0xE4, LTSSM_XDATA, 0, 1))[0] == 0
        await anyio.sleep(0.2)
        assert (await bridge.control_in(0xE4, LTSSM_XDATA, 0, 1))[0] == LINK_UP
        await bridge.control_out(0xF3, 0, 0, b"")
        assert (await bridge.control_in(0xE4, LTSSM_XDATA, 0, 1))[0] == 0


async def test_a_config_read_tlp_returns_its_completion():
    bridge = await powered(SimBridge(FakeGpu()))
    await bridge.control_out(0xF0, CFG_READ1 | 0xF << 8, 0, tlp(4 << 24, 0))
    assert completion(await bridge.control_in(0xF0, 0, 0, 8)) == (0x7550_1002, 0, 0)


async def test_a_config_request_of_the_wrong_type_for_its_bus_is_unsupported():
    bridge = await powered(SimBridge(FakeGpu()))
    await bridge.control_out(0xF0, CFG_READ0 | 0xF << 8, 0, tlp(4 << 24, 0))  # type 0 past bus 0
    assert (
        completion(await bridge.control_in(0xF0, 0, 0, 8))[1]
        == CompletionStatus.UNSUPPORTED_REQUEST
    )


async def test_an_unclaimed_address_completes_with_unsupported_request():
    bridge = await powered(SimBridge(FakeGpu()))
    await bridge.control_out(0xF0, CFG_READ1 | 0xF << 8, 0, tlp(5 << 24, 0))
    assert (
        completion(await bridge.control_in(0xF0, 0, 0, 8))[1]
        == CompletionStatus.UNSUPPORTED_REQUEST
    )


async def test_tlps_before_the_link_is_up_are_not_delivered():
    gpu = FakeGpu()
    bridge = SimBridge(gpu)
    await bridge.control_out(0xF0, CFG_READ1 | 0xF << 8, 0, tlp(4 << 24, 0))
    assert (
        completion(await bridge.control_in(0xF0, 0, 0, 8))[1]
        == CompletionStatus.UNSUPPORTED_REQUEST
    )


async def test_posted_memory_writes_and_reads_reach_the_gpu():
    gpu = FakeGpu()
    bridge = await powered(SimBridge(gpu))
    await bridge.control_out(0xF0, MWR32 | 0xF << 8, 0, tlp(FakeGpu.BASE + 0x40, 0xDEADBEEF))
    assert gpu.memory[0x40:0x44] == (0xDEADBEEF).to_bytes(4, "little")
    await bridge.control_out(0xF0, MRD32 | 0xF << 8, 0, tlp(FakeGpu.BASE + 0x40, 0))
    assert completion(await bridge.control_in(0xF0, 0, 0, 8))[0] == 0xDEADBEEF


async def test_streaming_writes_and_reads_ride_the_bulk_endpoints():
    gpu = FakeGpu()
    bridge = await powered(SimBridge(gpu))
    payload = bytes(range(256)) * 4
    await bridge.control_out(0xF0, MWR32, 1, tlp(FakeGpu.BASE + 0x1000, len(payload) // 4))
    assert await bridge.bulk_out(0x02, payload) == len(payload)
    assert gpu.memory[0x1000 : 0x1000 + len(payload)] == payload
    await bridge.control_out(0xF0, MRD32, 2, tlp(FakeGpu.BASE + 0x1000, len(payload) // 4))
    assert await bridge.bulk_in(0x81, len(payload)) == payload


async def test_an_armed_write_lands_in_sram_not_in_the_gpu():
    gpu = FakeGpu()
    bridge = await powered(SimBridge(gpu))
    wire = b"\xab" * 0x4000
    await bridge.control_out(0xF2, len(wire) // 512, 16 | 1 << 8, b"")
    assert await bridge.bulk_out(0x02, wire) == len(wire)
    assert bridge.sram[16 * SLOT : 17 * SLOT] == wire
    assert bridge.dma_read(SRAM_PCIE + 16 * SLOT, 4) == b"\xab" * 4
    assert not any(gpu.memory)


async def test_an_armed_read_waits_for_the_gpu_to_release_it():
    bridge = await powered(SimBridge(FakeGpu()))
    bridge.dma_write(SRAM_PCIE, b"\x5a" * 512)
    await bridge.control_out(0xF2, 1 | 0x8000, 0 | 1 << 8, b"")
    got = []
    async with virtual_time(), anyio.create_task_group() as tg:

        async def read():
            got.append((await bridge.bulk_in(0x81, 512), now()))

        start = now()
        tg.start_soon(read)
        await anyio.sleep(0.5)
        assert got == []  # still blocked: nothing released it
        bridge.dma_write(CQ_RELEASE_PCIE, bytes(4))
    assert got[0][0] == b"\x5a" * 512
    assert got[0][1] == pytest.approx(start + 0.5)


async def test_a_release_before_any_armed_read_releases_nothing():
    bridge = await powered(SimBridge(FakeGpu()))
    bridge.dma_write(CQ_RELEASE_PCIE, bytes(4))  # stale: no read armed
    await bridge.control_out(0xF2, 1 | 0x8000, 0 | 1 << 8, b"")
    async with virtual_time():
        with anyio.move_on_after(1.0) as scope:
            await bridge.bulk_in(0x81, 512)
    assert scope.cancelled_caught


async def test_the_gpu_writes_the_chunk_fence_where_the_host_reads_it():
    bridge = SimBridge(FakeGpu())
    bridge.dma_write(SYS_PCIE + 0x800, (3).to_bytes(4, "little"))
    assert await bridge.control_in(0xE4, FENCE_XDATA, 0, 1) == b"\x03"


async def test_protocol_mistakes_are_rejected_like_a_stall():
    bridge = await powered(SimBridge(FakeGpu()))
    with pytest.raises(SimTransferError, match="no armed"):
        await bridge.bulk_out(0x02, b"x" * 512)
    await bridge.control_out(0xF2, 2, 0 | 1 << 8, b"")
    with pytest.raises(SimTransferError, match="already armed"):
        await bridge.control_out(0xF2, 2, 0 | 1 << 8, b"")
    with pytest.raises(SimTransferError, match="armed for 1024"):
        await bridge.bulk_out(0x02, b"x" * 512)
    with pytest.raises(SimTransferError, match="does not fit"):
        await bridge.control_out(0xF2, 64, 31 | 1 << 8, b"")
    with pytest.raises(SimTransferError, match="unknown"):
        await bridge.control_out(0x99, 0, 0, b"")


async def test_a_retry_storm_answers_with_the_bridge_retry_status_until_cleared():
    plan = FaultPlan([FaultRule(Fault.TLP_RETRY_STORM, at=1, count=math.inf)])
    bridge = await powered(SimBridge(FakeGpu(), plan=plan))
    for _ in range(3):
        await bridge.control_out(0xF0, CFG_READ1 | 0xF << 8, 0, tlp(4 << 24, 0))
        assert completion(await bridge.control_in(0xF0, 0, 0, 8))[2] != 0
    plan.clear(Fault.TLP_RETRY_STORM)
    await bridge.control_out(0xF0, CFG_READ1 | 0xF << 8, 0, tlp(4 << 24, 0))
    assert completion(await bridge.control_in(0xF0, 0, 0, 8)) == (0x7550_1002, 0, 0)


async def test_a_disconnected_bridge_fails_every_transfer_until_it_reappears():
    plan = FaultPlan([FaultRule(Fault.DISCONNECT, at=2, count=math.inf)])
    bridge = SimBridge(FakeGpu(), plan=plan)
    await bridge.control_in(0xE4, 0, 0, 1)
    for _ in range(3):
        with pytest.raises(SimDeviceGone):
            await bridge.control_in(0xE4, 0, 0, 1)
    plan.clear(Fault.DISCONNECT)
    assert await bridge.control_in(0xE4, 0, 0, 1) == b"\x00"


async def test_a_transfer_timeout_fault_never_answers():
    plan = FaultPlan([FaultRule(Fault.USB_TIMEOUT, at=1)])
    bridge = SimBridge(FakeGpu(), plan=plan)
    async with virtual_time():
        with anyio.move_on_after(30.0) as scope:
            await bridge.control_in(0xE4, 0, 0, 1)
    assert scope.cancelled_caught
    assert await bridge.control_in(0xE4, 0, 0, 1) == b"\x00"  # only the first one was lost


async def test_a_short_transfer_fault_delivers_fewer_bytes():
    plan = FaultPlan([FaultRule(Fault.SHORT_TRANSFER, at=1, params={"length": 3})])
    bridge = SimBridge(FakeGpu(), plan=plan)
    assert len(await bridge.control_in(0xE4, 0, 0, 8)) == 3
    assert len(await bridge.control_in(0xE4, 0, 0, 8)) == 8


async def test_posted_writes_are_not_answered_retry_and_are_lost_with_the_link_down():
    gpu = FakeGpu()
    plan = FaultPlan([FaultRule(Fault.TLP_RETRY_STORM, at=1, count=math.inf)])
    bridge = await powered(SimBridge(gpu, plan=plan))
    await bridge.control_out(0xF0, MWR32 | 0xF << 8, 0, tlp(FakeGpu.BASE, 0x01020304))
    assert gpu.memory[:4] == bytes([4, 3, 2, 1])  # a storm only answers requests that complete
    assert plan.occurrences(Fault.TLP_RETRY_STORM) == 0
    await bridge.control_out(0xF3, 0, 0, b"")
    await bridge.control_out(0xF0, MWR32 | 0xF << 8, 0, tlp(FakeGpu.BASE, 0xFFFFFFFF))
    assert gpu.memory[:4] == bytes([4, 3, 2, 1])


async def test_streams_need_the_link_and_a_zero_length_stream_hangs():
    bridge = SimBridge(FakeGpu())
    with pytest.raises(SimTransferError, match="link down"):
        await bridge.control_out(0xF0, MWR32, 1, tlp(FakeGpu.BASE, 4))
    await powered(bridge)
    async with virtual_time():
        with anyio.move_on_after(5.0) as scope:
            await bridge.control_out(0xF0, MWR32, 1, tlp(FakeGpu.BASE, 0))
    assert scope.cancelled_caught


async def test_unclaimed_stream_reads_return_all_ones_and_writes_are_dropped():
    bridge = await powered(SimBridge(FakeGpu()))
    await bridge.control_out(0xF0, MWR32, 1, tlp(0x9000_0000, 1))
    assert await bridge.bulk_out(0x02, b"abcd") == 4
    await bridge.control_out(0xF0, MRD32, 2, tlp(0x9000_0000, 1))
    assert await bridge.bulk_in(0x81, 4) == b"\xff" * 4


async def test_powering_on_again_does_not_retrain_the_link():
    bridge = SimBridge(FakeGpu(), link_latency=1.0)
    async with virtual_time():
        await bridge.control_out(0xF3, 1, 0, b"")
        await anyio.sleep(1.0)
        await bridge.control_out(0xF3, 1, 0, b"")
        assert (await bridge.control_in(0xE4, LTSSM_XDATA, 0, 1))[0] == LINK_UP


async def test_a_bulk_transfer_that_does_not_complete_disarms_the_engine():
    bridge = await powered(SimBridge(FakeGpu()))
    await bridge.control_out(0xF2, 1 | 0x8000, 0 | 1 << 8, b"")
    async with virtual_time():
        with anyio.move_on_after(1.0):
            await bridge.bulk_in(0x81, 512)  # never released; the host gives up
    await bridge.control_out(0xF2, 1, 0 | 1 << 8, b"")  # and can arm again
    assert await bridge.bulk_out(0x02, b"y" * 512) == 512


async def test_an_unplug_fails_the_transfer_in_flight_and_the_bridge_returns_reset():
    plan = FaultPlan()
    bridge = await powered(SimBridge(FakeGpu(), plan=plan))
    await bridge.control_out(0xF2, 1 | 0x8000, 0 | 1 << 8, b"")
    async with anyio.create_task_group() as tg:
        outcome = []

        async def read():
            try:
                await bridge.bulk_in(0x81, 512)
            except SimDeviceGone:
                outcome.append("gone")

        tg.start_soon(read)
        await anyio.sleep(0.01)
        bridge.unplug()
    assert outcome == ["gone"]
    # back on the bus: re-enumerated, so powered off and with nothing armed
    assert (await bridge.control_in(0xE4, LTSSM_XDATA, 0, 1))[0] == 0
    with pytest.raises(SimTransferError, match="no armed"):
        await bridge.bulk_in(0x81, 512)


async def test_a_short_data_stage_on_a_request_is_reported_and_not_carried_out():
    plan = FaultPlan([FaultRule(Fault.SHORT_TRANSFER, at=1, params={"length": 5})])
    gpu = FakeGpu()
    bridge = await powered(SimBridge(gpu, plan=plan))
    assert await bridge.control_out(0xF0, MWR32 | 0xF << 8, 0, tlp(FakeGpu.BASE, 0x55)) == 5
    assert not any(gpu.memory)
    await bridge.control_out(0xE5, FENCE_XDATA, 1, b"")  # no data stage: not cut short
    assert plan.occurrences(Fault.SHORT_TRANSFER) == 1
