"""The libusb backend through real libusb, against the simulated bridge as an emulated USB device:
transfers driven by the event loop, every failure typed, nothing left in flight."""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import AsyncIterator

import anyio
import pytest

from aio_runtime import (
    BudgetExhausted,
    DeviceLost,
    Layer,
    Ledger,
    UsbTransferTimeout,
    deadline_scope,
    use_ledger,
)
from transports.bridge import BridgeClient
from transports.protocol.bridge import CQ_RELEASE_PCIE, FENCE_XDATA
from transports.sim import Fault, FaultRule, SimBridge
from transports.sim.server import SimServer
from transports.sim.umockdev import EmulatedBridge
from transports.usb import CONTROL_IN, CONTROL_OUT
from transports.usb.libusb_backend import LibusbContext, LibusbTransport, open_bridge

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]
LIMIT = 10.0
"""Outer bound on every test's body (a hang fails the test, not the run)."""


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the libusb backend's event integration is asyncio's


@contextlib.asynccontextmanager
async def opened() -> AsyncIterator[tuple[LibusbContext, LibusbTransport]]:
    async with LibusbContext() as context:
        usb = await open_bridge(context, timeout=5)
        try:
            yield context, usb
        finally:
            await usb.aclose()


def arm(slot: int, length: int, *, read: bool) -> tuple[int, int]:
    """wValue, wIndex of an 0xF2 SRAM arm."""
    return length // 512 | (0x8000 if read else 0), slot | 1 << 8


async def test_the_bridge_enumerates_opens_and_closes(emulated: EmulatedBridge):
    with anyio.fail_after(LIMIT):
        async with opened() as (context, usb):
            device = usb.handle.getDevice()
            assert (device.getVendorID(), device.getProductID()) == (0xADD1, 0x0001)
            assert usb.handle.getProduct().startswith("custom")
            assert context.polled_fds  # umockdev's node: epoll refuses it, a timer polls it
        assert not context.polled_fds  # closing the device stopped the polling


async def test_no_bridge_on_the_bus_is_device_lost(emulated: EmulatedBridge):
    with anyio.fail_after(LIMIT):
        async with LibusbContext() as context:
            with pytest.raises(DeviceLost, match="no USB-PCIe bridge") as info:
                await open_bridge(context, timeout=5, ids=[(0x1234, 0x5678)])
            assert info.value.layer is Layer.USB_TRANSFER
            with pytest.raises(DeviceLost, match="skipped"):
                await open_bridge(context, timeout=5, products=("AS2462",))


async def test_vendor_requests_reach_controller_memory_and_the_pcie_side(
    emulated: EmulatedBridge, server: SimServer[SimBridge]
):
    with anyio.fail_after(LIMIT):
        async with opened() as (_, usb):
            await usb.control_out(CONTROL_OUT, 0xE5, FENCE_XDATA, 0x5A, timeout=1)
            await usb.control_out(CONTROL_OUT, 0xE5, FENCE_XDATA + 1, 0xA5, timeout=1)
            assert await usb.control_in(CONTROL_IN, 0xE4, FENCE_XDATA, 0, 2, timeout=1) == (
                b"\x5a\xa5"
            )
            client = BridgeClient(usb)
            await client.bring_up_link(timeout=2)
            assert await client.config_read(4, 0, 0, 0x00) == 0x7550_1002  # the FakeGpu's id
    assert server.run(lambda: bytes(server.device.xdata[FENCE_XDATA : FENCE_XDATA + 2])) == (
        b"\x5a\xa5"
    )


async def test_an_sram_round_trip_through_real_libusb(
    emulated: EmulatedBridge, server: SimServer[SimBridge]
):
    wire = bytes(range(256)) * 64  # one 16 KiB slot
    with anyio.fail_after(LIMIT):
        async with opened() as (_, usb):
            await usb.control_out(CONTROL_OUT, 0xF2, *arm(0, len(wire), read=False), timeout=1)
            await usb.bulk_out(0x02, wire, timeout=1)
            await usb.control_out(CONTROL_OUT, 0xF2, *arm(0, len(wire), read=True), timeout=1)
            server.call(server.device.dma_write, CQ_RELEASE_PCIE, bytes(4))  # the GPU releases it
            assert await usb.bulk_in(0x81, len(wire), timeout=1) == wire


async def test_two_bulk_outs_in_flight_land_in_order(
    emulated: EmulatedBridge, server: SimServer[SimBridge]
):
    ledger = Ledger()
    with anyio.fail_after(LIMIT), use_ledger(ledger):
        async with opened() as (_, usb):
            for slot in (0, 1):
                await usb.control_out(CONTROL_OUT, 0xF2, *arm(slot, 512, read=False), timeout=1)
            first = usb.submit_bulk_out(0x02, bytearray(b"A" * 512), timeout=1)
            second = usb.submit_bulk_out(0x02, b"B" * 512, timeout=1)
            assert len(ledger.live()) == 2
            await first.wait()
            await second.wait()
        ledger.assert_empty()
    sram = server.run(lambda: bytes(server.device.sram[: 0x4000 + 512]))
    assert sram[:512] == b"A" * 512 and sram[0x4000:] == b"B" * 512


async def test_a_transfer_the_device_never_answers_times_out_and_is_reaped(
    emulated: EmulatedBridge, server: SimServer[SimBridge]
):
    ledger = Ledger()
    with anyio.fail_after(LIMIT), use_ledger(ledger):
        async with opened() as (_, usb):
            server.run(server.device.plan.add, FaultRule(Fault.USB_TIMEOUT, at=1))
            started = time.monotonic()
            with pytest.raises(UsbTransferTimeout) as info:
                await usb.control_in(CONTROL_IN, 0xE4, FENCE_XDATA, 0, 1, timeout=0.1)
            took = time.monotonic() - started
            ledger.assert_empty()  # the URB was discarded and reaped before the error
            assert await usb.control_in(CONTROL_IN, 0xE4, FENCE_XDATA, 0, 1, timeout=1)
    exc = info.value
    assert exc.layer is Layer.USB_TRANSFER and not exc.in_flight
    assert exc.awaited == "control IN 0xe4 (value 0xa800, 1 bytes)"
    assert exc.timeout == 0.1 and 0.1 <= exc.elapsed < 0.5 and took < 0.6
    assert emulated.discards == 1


async def test_a_frame_budget_bounds_a_bulk_in_that_is_never_released(emulated: EmulatedBridge):
    with anyio.fail_after(LIMIT):
        async with opened() as (_, usb):
            await usb.control_out(CONTROL_OUT, 0xF2, *arm(0, 512, read=True), timeout=1)
            with deadline_scope(0.05, name="frame 7"), pytest.raises(BudgetExhausted) as info:
                await usb.bulk_in(0x81, 512, timeout=10)
    assert info.value.budget == "frame 7" and info.value.layer is Layer.USB_TRANSFER
    assert info.value.elapsed < 0.5


async def test_a_cancelled_wait_discards_the_transfer_and_awaits_its_callback(
    emulated: EmulatedBridge, server: SimServer[SimBridge]
):
    ledger = Ledger()
    with anyio.fail_after(LIMIT), use_ledger(ledger):
        async with opened() as (_, usb):
            server.run(server.device.plan.add, FaultRule(Fault.USB_TIMEOUT, at=1))
            with anyio.move_on_after(0.05) as scope:  # the caller gives up: not a bound
                await usb.bulk_in(0x81, 512, timeout=10)
            assert scope.cancelled_caught
            ledger.assert_empty()  # the callback ran before the cancellation went on
            assert emulated.discards == 1


async def test_an_unplug_is_device_lost_until_the_bridge_is_opened_again(
    emulated: EmulatedBridge, server: SimServer[SimBridge]
):
    rule = FaultRule(Fault.DISCONNECT, at=1, count=math.inf)
    with anyio.fail_after(LIMIT):
        async with opened() as (_, usb):
            server.run(server.device.plan.add, rule)
            with pytest.raises(DeviceLost) as info:
                await usb.control_in(CONTROL_IN, 0xE4, FENCE_XDATA, 0, 1, timeout=1)
            assert info.value.layer is Layer.USB_TRANSFER
            server.run(server.device.plan.clear, Fault.DISCONNECT)
            with pytest.raises(DeviceLost, match="open it again"):
                await usb.control_in(CONTROL_IN, 0xE4, FENCE_XDATA, 0, 1, timeout=1)
        async with opened() as (_, usb):  # the bridge re-enumerated
            assert await usb.control_in(CONTROL_IN, 0xE4, FENCE_XDATA, 0, 1, timeout=1) == b"\0"


async def test_a_reset_forgets_what_was_armed(emulated: EmulatedBridge):
    with anyio.fail_after(LIMIT):
        async with opened() as (_, usb):
            await usb.control_out(CONTROL_OUT, 0xF2, *arm(0, 512, read=True), timeout=1)
            await usb.reset(timeout=2)
            await usb.control_out(CONTROL_OUT, 0xF2, *arm(0, 512, read=False), timeout=1)
            await usb.bulk_out(0x02, b"w" * 512, timeout=1)  # the write arm, not the read before
