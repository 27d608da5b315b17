"""The simulated USB-PCIe bridge, driven the way a host drives it: URBs for vendor requests and
bulk data."""

from __future__ import annotations

import math
import struct

import anyio
import pytest
from fake_pcie import FakeGpu

from aio_runtime.testing import virtual_time
from transports.protocol.bridge import (
    CQ_RELEASE_PCIE,
    FENCE_XDATA,
    LINK_UP,
    LTSSM_XDATA,
    SLOT,
    SRAM_PCIE,
    SYS_PCIE,
    CompletionStatus,
)
from transports.sim import Fault, FaultPlan, FaultRule
from transports.sim.bridge import SimBridge
from transports.sim.urb import SimUrb, UrbStatus

MWR32, MRD32, CFG_READ0, CFG_READ1 = 0x40, 0x00, 0x04, 0x05
OK, STALL = UrbStatus.COMPLETED, UrbStatus.STALL

pytestmark = pytest.mark.anyio


def tlp(address: int, word: int) -> bytes:
    return struct.pack("<III", address & 0xFFFFFFFF, address >> 32, word)


def submit(bridge: SimBridge, urb: SimUrb) -> SimUrb:
    bridge.submit(urb)
    return urb


def out(bridge: SimBridge, request: int, value: int, index: int, data: bytes = b"") -> SimUrb:
    return submit(bridge, SimUrb(0, 0x40, request, value, index, data=data))


def read(bridge: SimBridge, request: int, value: int, length: int) -> SimUrb:
    return submit(bridge, SimUrb(0, 0xC0, request, value, 0, length=length))


def bulk_out(bridge: SimBridge, data: bytes) -> SimUrb:
    return submit(bridge, SimUrb(0x02, data=data))


def bulk_in(bridge: SimBridge, length: int) -> SimUrb:
    return submit(bridge, SimUrb(0x81, length=length))


def completion(bridge: SimBridge) -> tuple[int, int, int]:
    data, status_byte, _, _, bridge_status = struct.unpack(
        "<IBBBB", read(bridge, 0xF0, 0, 8).result
    )
    return data, status_byte >> 5, bridge_status


def powered(bridge: SimBridge) -> SimBridge:
    assert out(bridge, 0xF3, 1, 0).status is OK
    return bridge


async def test_controller_memory_is_written_a_byte_at_a_time_and_read_in_blocks():
    bridge = SimBridge(FakeGpu())
    for i, byte in enumerate(b"\x01\x02\x03"):
        out(bridge, 0xE5, FENCE_XDATA + i, byte)
    assert read(bridge, 0xE4, FENCE_XDATA, 4).result == b"\x01\x02\x03\x00"
    assert read(bridge, 0xE4, 0, 0x100).status is STALL  # at most 0xFF bytes per request


async def test_the_link_comes_up_after_power_on_and_its_latency():
    async with virtual_time():
        bridge = SimBridge(FakeGpu(), link_latency=0.2)
        powers = []
        bridge.on_power = powers.append
        assert read(bridge, 0xE4, LTSSM_XDATA, 1).result == b"\x00"
        out(bridge, 0xF3, 1, 0)
        assert read(bridge, 0xE4, LTSSM_XDATA, 1).result == b"\x00"
        await anyio.sleep(0.2)
        assert read(bridge, 0xE4, LTSSM_XDATA, 1).result == bytes([LINK_UP])
        out(bridge, 0xF3, 1, 0)  # powering on again neither retrains nor tells the GPU
        out(bridge, 0xF3, 0, 0)
        assert read(bridge, 0xE4, LTSSM_XDATA, 1).result == b"\x00"
        assert powers == [True, False]


async def test_a_config_read_tlp_returns_its_completion():
    bridge = powered(SimBridge(FakeGpu()))
    out(bridge, 0xF0, CFG_READ1 | 0xF << 8, 0, tlp(4 << 24, 0))
    assert completion(bridge) == (0x7550_1002, 0, 0)


@pytest.mark.parametrize(
    ("fmt", "address", "link"),
    [
        (CFG_READ0, 4 << 24, True),  # type 0 past bus 0
        (CFG_READ1, 5 << 24, True),  # nobody on bus 5
        (CFG_READ1, 4 << 24, False),  # the link is down
    ],
)
async def test_requests_nobody_can_answer_complete_with_unsupported_request(fmt, address, link):
    bridge = SimBridge(FakeGpu())
    if link:
        powered(bridge)
    out(bridge, 0xF0, fmt | 0xF << 8, 0, tlp(address, 0))
    assert completion(bridge)[1] == CompletionStatus.UNSUPPORTED_REQUEST


async def test_posted_memory_writes_and_reads_reach_the_gpu():
    gpu = FakeGpu()
    bridge = powered(SimBridge(gpu))
    out(bridge, 0xF0, MWR32 | 0xF << 8, 0, tlp(FakeGpu.BASE + 0x40, 0xDEADBEEF))
    assert gpu.memory[0x40:0x44] == (0xDEADBEEF).to_bytes(4, "little")
    out(bridge, 0xF0, MRD32 | 0xF << 8, 0, tlp(FakeGpu.BASE + 0x40, 0))
    assert completion(bridge)[0] == 0xDEADBEEF


async def test_streaming_writes_and_reads_ride_the_bulk_endpoints():
    gpu = FakeGpu()
    bridge = powered(SimBridge(gpu))
    payload = bytes(range(256)) * 4
    out(bridge, 0xF0, MWR32, 1, tlp(FakeGpu.BASE + 0x1000, len(payload) // 4))
    assert bulk_out(bridge, payload).actual == len(payload)
    assert gpu.memory[0x1000 : 0x1000 + len(payload)] == payload
    out(bridge, 0xF0, MRD32, 2, tlp(FakeGpu.BASE + 0x1000, len(payload) // 4))
    assert bulk_in(bridge, len(payload)).result == payload


async def test_an_armed_write_lands_in_sram_not_in_the_gpu_and_the_gpu_is_told():
    gpu = FakeGpu()
    bridge = powered(SimBridge(gpu))
    seen = []
    bridge.on_sram_write = lambda offset, length: seen.append((offset, length))
    wire = b"\xab" * 0x4000
    out(bridge, 0xF2, len(wire) // 512, 16 | 1 << 8)
    assert bulk_out(bridge, wire).actual == len(wire)
    assert bridge.sram[16 * SLOT : 17 * SLOT] == wire
    assert bytes(bridge.dma_read(SRAM_PCIE + 16 * SLOT, 4)) == b"\xab" * 4
    assert not any(gpu.memory)
    assert seen == [(16 * SLOT, len(wire))]


async def test_two_arms_queue_and_bind_to_the_bulk_transfers_in_order():
    bridge = powered(SimBridge(FakeGpu()))
    out(bridge, 0xF2, 1, 0 | 1 << 8)
    out(bridge, 0xF2, 1, 16 | 1 << 8)
    bulk_out(bridge, b"A" * 512)
    bulk_out(bridge, b"B" * 512)
    assert bridge.sram[:512] == b"A" * 512
    assert bridge.sram[16 * SLOT : 16 * SLOT + 512] == b"B" * 512


async def test_an_armed_read_completes_only_once_the_gpu_releases_it():
    bridge = powered(SimBridge(FakeGpu()))
    bridge.dma_write(SRAM_PCIE, b"\x5a" * 512)
    out(bridge, 0xF2, 1 | 0x8000, 0 | 1 << 8)
    urb = bulk_in(bridge, 512)
    assert not urb.done  # nothing released it yet
    bridge.dma_write(CQ_RELEASE_PCIE, bytes(4))
    assert urb.status is OK and urb.result == b"\x5a" * 512


async def test_a_release_that_comes_before_the_bulk_in_is_kept_by_the_arm():
    bridge = powered(SimBridge(FakeGpu()))
    out(bridge, 0xF2, 1 | 0x8000, 0 | 1 << 8)
    bridge.dma_write(SRAM_PCIE, b"\x11" * 512)
    bridge.dma_write(CQ_RELEASE_PCIE, bytes(4))
    assert bulk_in(bridge, 512).result == b"\x11" * 512


async def test_a_release_before_any_armed_read_releases_nothing():
    bridge = powered(SimBridge(FakeGpu()))
    bridge.dma_write(CQ_RELEASE_PCIE, bytes(4))  # stale: no read armed
    out(bridge, 0xF2, 1 | 0x8000, 0 | 1 << 8)
    assert not bulk_in(bridge, 512).done


async def test_the_gpu_writes_the_chunk_fence_where_the_host_reads_it():
    bridge = SimBridge(FakeGpu())
    bridge.dma_write(SYS_PCIE + 0x800, (3).to_bytes(4, "little"))
    assert read(bridge, 0xE4, FENCE_XDATA, 1).result == b"\x03"


async def test_protocol_mistakes_are_stalls():
    bridge = powered(SimBridge(FakeGpu()))
    assert "no armed" in bulk_out(bridge, b"x" * 512).error
    out(bridge, 0xF2, 2, 0 | 1 << 8)
    for _ in range(3):
        assert out(bridge, 0xF2, 2, 0 | 1 << 8).status is OK
    assert "already armed" in out(bridge, 0xF2, 2, 0 | 1 << 8).error
    assert "armed for 1024" in bulk_out(bridge, b"x" * 512).error
    assert "does not fit" in out(bridge, 0xF2, 64, 31 | 1 << 8).error
    assert "unknown" in out(bridge, 0x99, 0, 0).error
    assert submit(bridge, SimUrb(0, 0x80, 0x06, 0x100, 0, length=18)).status is STALL


async def test_a_retry_storm_answers_with_the_bridge_retry_status_until_cleared():
    plan = FaultPlan([FaultRule(Fault.TLP_RETRY_STORM, at=1, count=math.inf)])
    bridge = powered(SimBridge(FakeGpu(), plan=plan))
    for _ in range(3):
        out(bridge, 0xF0, CFG_READ1 | 0xF << 8, 0, tlp(4 << 24, 0))
        assert completion(bridge)[2] != 0
    plan.clear(Fault.TLP_RETRY_STORM)
    out(bridge, 0xF0, CFG_READ1 | 0xF << 8, 0, tlp(4 << 24, 0))
    assert completion(bridge) == (0x7550_1002, 0, 0)


async def test_a_disconnected_bridge_fails_every_transfer_until_it_reappears():
    plan = FaultPlan([FaultRule(Fault.DISCONNECT, at=2, count=math.inf)])
    bridge = SimBridge(FakeGpu(), plan=plan)
    assert read(bridge, 0xE4, 0, 1).status is OK
    for _ in range(3):
        assert read(bridge, 0xE4, 0, 1).status is UrbStatus.NO_DEVICE
    plan.clear(Fault.DISCONNECT)
    assert read(bridge, 0xE4, 0, 1).result == b"\x00"


async def test_a_transfer_timeout_fault_never_answers_until_discarded():
    plan = FaultPlan([FaultRule(Fault.USB_TIMEOUT, at=1)])
    bridge = SimBridge(FakeGpu(), plan=plan)
    urb = read(bridge, 0xE4, 0, 1)
    assert not urb.done
    bridge.discard(urb)
    assert urb.status is UrbStatus.CANCELLED
    assert read(bridge, 0xE4, 0, 1).result == b"\x00"  # only the first one was lost


async def test_a_hung_bulk_transfer_holds_back_the_ones_behind_it():
    plan = FaultPlan()
    bridge = powered(SimBridge(FakeGpu(), plan=plan))
    out(bridge, 0xF2, 1, 0 | 1 << 8)
    out(bridge, 0xF2, 1, 16 | 1 << 8)
    plan.add(FaultRule(Fault.USB_TIMEOUT, at=1))
    first = bulk_out(bridge, b"A" * 512)
    second = bulk_out(bridge, b"B" * 512)
    assert not first.done and not second.done  # the pipe is in order: the second waits
    bridge.discard(first)  # the host gives up on the first: its arm goes with it
    assert first.status is UrbStatus.CANCELLED
    assert second.status is OK
    assert bridge.sram[:512] == bytes(512)  # the first's half never got data
    assert bridge.sram[16 * SLOT : 16 * SLOT + 512] == b"B" * 512  # the second's arm, its half


async def test_a_lost_completion_delivers_the_data_but_never_completes():
    plan = FaultPlan([FaultRule(Fault.USB_COMPLETION_LOST, at=1)])
    bridge = powered(SimBridge(FakeGpu(), plan=plan))
    seen = []
    bridge.on_sram_write = lambda offset, length: seen.append(offset)
    out(bridge, 0xF2, 1, 0 | 1 << 8)
    urb = bulk_out(bridge, b"C" * 512)
    assert bridge.sram[:512] == b"C" * 512 and seen == [0]
    assert not urb.done
    bridge.discard(urb)
    assert urb.status is UrbStatus.CANCELLED


async def test_a_short_transfer_fault_delivers_fewer_bytes():
    plan = FaultPlan([FaultRule(Fault.SHORT_TRANSFER, at=1, params={"length": 3})])
    bridge = SimBridge(FakeGpu(), plan=plan)
    assert read(bridge, 0xE4, 0, 8).actual == 3
    assert read(bridge, 0xE4, 0, 8).actual == 8


async def test_posted_writes_are_not_answered_retry_and_are_lost_with_the_link_down():
    gpu = FakeGpu()
    plan = FaultPlan([FaultRule(Fault.TLP_RETRY_STORM, at=1, count=math.inf)])
    bridge = powered(SimBridge(gpu, plan=plan))
    out(bridge, 0xF0, MWR32 | 0xF << 8, 0, tlp(FakeGpu.BASE, 0x01020304))
    assert gpu.memory[:4] == bytes([4, 3, 2, 1])  # a storm only answers requests that complete
    assert plan.occurrences(Fault.TLP_RETRY_STORM) == 0
    out(bridge, 0xF3, 0, 0)
    out(bridge, 0xF0, MWR32 | 0xF << 8, 0, tlp(FakeGpu.BASE, 0xFFFFFFFF))
    assert gpu.memory[:4] == bytes([4, 3, 2, 1])


async def test_streams_need_the_link_and_a_zero_length_stream_hangs():
    bridge = SimBridge(FakeGpu())
    assert "link down" in out(bridge, 0xF0, MWR32, 1, tlp(FakeGpu.BASE, 4)).error
    powered(bridge)
    assert not out(bridge, 0xF0, MWR32, 1, tlp(FakeGpu.BASE, 0)).done


async def test_unclaimed_stream_reads_return_all_ones_and_writes_are_dropped():
    bridge = powered(SimBridge(FakeGpu()))
    out(bridge, 0xF0, MWR32, 1, tlp(0x9000_0000, 1))
    assert bulk_out(bridge, b"abcd").actual == 4
    out(bridge, 0xF0, MRD32, 2, tlp(0x9000_0000, 1))
    assert bulk_in(bridge, 4).result == b"\xff" * 4


async def test_a_discarded_bulk_transfer_disarms_the_engine():
    bridge = powered(SimBridge(FakeGpu()))
    out(bridge, 0xF2, 1 | 0x8000, 0 | 1 << 8)
    urb = bulk_in(bridge, 512)  # never released; the host gives up
    bridge.discard(urb)
    out(bridge, 0xF2, 1, 0 | 1 << 8)  # and can arm again
    assert bulk_out(bridge, b"y" * 512).actual == 512


async def test_a_reset_cancels_transfers_in_flight_and_forgets_arms():
    bridge = powered(SimBridge(FakeGpu()))
    out(bridge, 0xF2, 1 | 0x8000, 0 | 1 << 8)
    urb = bulk_in(bridge, 512)
    bridge.reset()
    assert urb.status is UrbStatus.CANCELLED
    assert "no armed" in bulk_out(bridge, b"y" * 512).error
    assert bridge.powered  # a USB reset keeps PCIe power


async def test_an_unplug_fails_the_transfer_in_flight_and_the_bridge_returns_reset():
    bridge = powered(SimBridge(FakeGpu()))
    out(bridge, 0xF2, 1 | 0x8000, 0 | 1 << 8)
    urb = bulk_in(bridge, 512)
    bridge.unplug()
    assert urb.status is UrbStatus.NO_DEVICE
    # back on the bus: re-enumerated, so powered off and with nothing armed
    assert read(bridge, 0xE4, LTSSM_XDATA, 1).result == b"\x00"
    assert "no armed" in bulk_in(bridge, 512).error


async def test_a_short_data_stage_on_a_request_is_reported_and_not_carried_out():
    plan = FaultPlan([FaultRule(Fault.SHORT_TRANSFER, at=1, params={"length": 5})])
    gpu = FakeGpu()
    bridge = powered(SimBridge(gpu, plan=plan))
    assert out(bridge, 0xF0, MWR32 | 0xF << 8, 0, tlp(FakeGpu.BASE, 0x55)).actual == 5
    assert not any(gpu.memory)
    out(bridge, 0xE5, FENCE_XDATA, 1)  # no data stage: not cut short
    assert plan.occurrences(Fault.SHORT_TRANSFER) == 1
