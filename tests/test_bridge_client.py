"""The host side of the bridge protocol, against the simulated bridge through the simulated USB
backend: every request bounded, every failure typed with its layer."""

from __future__ import annotations

import math

import anyio
import pytest
from fake_pcie import FakeGpu

from aio_runtime import Layer, PcieRequestTimeout, UsbTransferTimeout, now
from aio_runtime.testing import virtual_time
from transports.bridge import BridgeClient, PcieCompletionError, PcieRetriesExhausted
from transports.protocol.bridge import CQ_RELEASE_PCIE, FENCE_XDATA, LINK_UP
from transports.sim import Fault, FaultPlan, FaultRule
from transports.sim.bridge import SimBridge
from transports.sim.usb import SimUsbTransport

pytestmark = pytest.mark.anyio


def client(*rules: FaultRule, link_latency: float = 0.0, **kwargs) -> BridgeClient:
    gpu = FakeGpu()
    bridge = SimBridge(gpu, plan=FaultPlan(rules), link_latency=link_latency)
    return BridgeClient(SimUsbTransport(bridge), **kwargs)


def bridge_of(c: BridgeClient) -> SimBridge:
    return c.usb.bridge  # type: ignore[attr-defined,no-any-return]


async def test_controller_memory_reads_are_split_into_0xff_byte_requests():
    c = client()
    await c.write_xdata(FENCE_XDATA, b"\x07\x00\x00\x01")
    assert (await c.read_xdata(FENCE_XDATA, 4)) == b"\x07\x00\x00\x01"
    bridge_of(c).requests.clear()
    assert len(await c.read_xdata(0x1000, 600)) == 600
    assert [r[0] for r in bridge_of(c).requests] == ["control_in"] * 3


async def test_bring_up_waits_for_the_link_to_train():
    c = client(link_latency=0.3)
    async with virtual_time():
        start = now()
        await c.bring_up_link(timeout=2.0)
        assert now() - start == pytest.approx(0.3, abs=0.01)
    assert await c.link_state() == LINK_UP


async def test_a_link_that_never_trains_is_a_typed_timeout():
    c = client(link_latency=math.inf)
    async with virtual_time():
        with pytest.raises(PcieRequestTimeout) as info:
            await c.bring_up_link(timeout=2.0)
    assert (info.value.expected, info.value.observed) == (LINK_UP, 0)
    assert info.value.layer is Layer.PCIE_REQUEST


async def test_config_and_memory_requests_reach_the_gpu():
    c = client()
    await c.bring_up_link(timeout=1.0)
    assert await c.config_read(4, 0, 0, 0) == 0x7550_1002
    await c.config_write(4, 0, 0, 0x10, 0xBEEF, size=2)
    gpu = bridge_of(c).target
    assert gpu.config_writes == [(0x10, 0xBEEF, 0b0011)]
    base = FakeGpu.BASE
    await c.mem_write(base + 0x20, 0x11223344)
    await c.mem_write(base + 0x25, 0xAA, size=1)
    await c.mem_write(base + 0x26, 0xBBCC, size=2)
    assert gpu.memory[0x20:0x28] == bytes.fromhex("44332211 00aaccbb".replace(" ", ""))
    assert await c.mem_read(base + 0x20) == 0x11223344
    assert await c.mem_read(base + 0x26, size=2) == 0xBBCC
    assert await c.mem_read(base + 0x25, size=1) == 0xAA


async def test_an_unsupported_request_fails_at_once_on_the_pcie_layer():
    c = client()
    await c.bring_up_link(timeout=1.0)
    with pytest.raises(PcieCompletionError) as info:
        await c.config_read(5, 0, 0, 0)
    assert info.value.status == 1
    assert info.value.layer is Layer.PCIE_REQUEST
    assert "unsupported request" in str(info.value)


async def test_a_short_retry_storm_is_ridden_out():
    c = client(FaultRule(Fault.TLP_RETRY_STORM, at=1, count=3))
    await c.bring_up_link(timeout=1.0)
    async with virtual_time():
        assert await c.config_read(4, 0, 0, 0) == 0x7550_1002
    assert bridge_of(c).plan.occurrences(Fault.TLP_RETRY_STORM) == 4


async def test_an_endless_retry_storm_ends_after_the_retry_limit():
    c = client(FaultRule(Fault.TLP_RETRY_STORM, at=1, count=math.inf), retries=10)
    await c.bring_up_link(timeout=1.0)
    async with virtual_time():
        with pytest.raises(PcieRetriesExhausted) as info:
            await c.config_read(4, 0, 0, 0)
    assert info.value.layer is Layer.PCIE_REQUEST
    assert bridge_of(c).plan.occurrences(Fault.TLP_RETRY_STORM) == 11


async def test_a_lost_completion_is_told_apart_by_layer():
    # The second transfer of the request (reading its completion) is never answered.
    async def lost_completion(**kwargs):
        c = client(**kwargs)
        await c.bring_up_link(timeout=1.0)
        bridge_of(c).plan.add(FaultRule(Fault.USB_TIMEOUT, at=2))
        return c

    async with virtual_time():
        c = await lost_completion(control_timeout=0.5, request_timeout=5.0)
        with pytest.raises(UsbTransferTimeout) as usb_info:
            await c.config_read(4, 0, 0, 0)
        c = await lost_completion(control_timeout=5.0, request_timeout=0.5)
        with pytest.raises(PcieRequestTimeout) as pcie_info:
            await c.config_read(4, 0, 0, 0)
    assert usb_info.value.layer is Layer.USB_TRANSFER
    assert usb_info.value.elapsed == pytest.approx(0.5)
    assert pcie_info.value.layer is Layer.PCIE_REQUEST
    assert pcie_info.value.awaited.endswith(": completion")


async def test_streaming_writes_and_reads_round_trip():
    c = client()
    await c.bring_up_link(timeout=1.0)
    payload = bytes(range(256)) * 16
    await c.write_stream(FakeGpu.BASE + 0x4000, payload)
    assert await c.read_stream(FakeGpu.BASE + 0x4000, len(payload)) == payload
    with pytest.raises(ValueError):
        await c.write_stream(FakeGpu.BASE + 2, b"abcd")


async def test_sram_is_reached_by_arming_the_dma_engine():
    c = client()
    wire = bytes(range(256)) * 64
    await c.arm_sram(read=False, slot=16, length=len(wire))
    await c.usb.bulk_out(0x02, wire, timeout=1.0)
    await c.arm_sram(read=True, slot=16, length=len(wire))
    async with anyio.create_task_group() as tg:
        result = []

        async def read():
            result.append(await c.usb.bulk_in(0x81, len(wire), timeout=1.0))

        tg.start_soon(read)
        await anyio.sleep(0.01)
        bridge_of(c).dma_write(CQ_RELEASE_PCIE, bytes(4))
    assert result == [wire]
    for bad in ({"slot": 0, "length": 100}, {"slot": 31, "length": 0x8000}):
        with pytest.raises(ValueError):
            await c.arm_sram(read=True, **bad)


async def test_link_bring_up_is_one_bound_from_the_first_request():
    c = client(FaultRule(Fault.USB_TIMEOUT, at=1))  # the very first link-state read hangs
    async with virtual_time():
        with pytest.raises(PcieRequestTimeout) as info:
            await c.bring_up_link(timeout=0.1)
    assert info.value.elapsed == pytest.approx(0.1)
    assert info.value.awaited == "PCIe link state"


async def test_a_stream_whose_data_stage_hangs_is_a_pcie_request_timeout():
    c = client(request_timeout=0.5)
    await c.bring_up_link(timeout=1.0)
    bridge_of(c).plan.add(FaultRule(Fault.USB_TIMEOUT, at=2))  # the bulk stage
    async with virtual_time():
        with pytest.raises(PcieRequestTimeout) as info:
            await c.read_stream(FakeGpu.BASE, 64)
    assert info.value.awaited.endswith(": data")
