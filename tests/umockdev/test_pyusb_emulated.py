"""The pyusb backend through real libusb, against the simulated bridge as an emulated USB device:
blocking calls on worker threads, each bounded by the time left (asyncio and trio)."""

from __future__ import annotations

import math
import time

import anyio
import pytest

from aio_runtime import DeviceLost, Layer, Ledger, UsbTransferTimeout, use_ledger
from transports.bridge import BridgeClient
from transports.protocol.bridge import CQ_RELEASE_PCIE, FENCE_XDATA
from transports.sim import Fault, FaultRule, SimBridge
from transports.sim.server import SimServer
from transports.sim.umockdev import EmulatedBridge
from transports.usb import CONTROL_IN, CONTROL_OUT
from transports.usb.pyusb_backend import open_pyusb_bridge

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(30)]
LIMIT = 10.0


async def test_vendor_requests_and_a_pcie_config_read(emulated: EmulatedBridge):
    with anyio.fail_after(LIMIT):
        usb = await open_pyusb_bridge(timeout=5)
        try:
            await usb.control_out(CONTROL_OUT, 0xE5, FENCE_XDATA, 0x42, timeout=1)
            assert await usb.control_in(CONTROL_IN, 0xE4, FENCE_XDATA, 0, 1, timeout=1) == b"\x42"
            client = BridgeClient(usb)
            await client.bring_up_link(timeout=2)
            assert await client.config_read(4, 0, 0, 0x00) == 0x7550_1002
        finally:
            await usb.aclose()


async def test_sram_writes_in_flight_land_in_order_and_read_back(
    emulated: EmulatedBridge, server: SimServer[SimBridge]
):
    ledger = Ledger()
    with anyio.fail_after(LIMIT), use_ledger(ledger):
        usb = await open_pyusb_bridge(timeout=5)
        try:
            for slot in (0, 1):
                await usb.control_out(CONTROL_OUT, 0xF2, 1, slot | 1 << 8, timeout=1)
            first = usb.submit_bulk_out(0x02, b"A" * 512, timeout=1)
            second = usb.submit_bulk_out(0x02, b"B" * 512, timeout=1)
            await first.wait()
            await second.wait()
            await usb.control_out(CONTROL_OUT, 0xF2, 1 | 0x8000, 1 | 1 << 8, timeout=1)
            server.call(server.device.dma_write, CQ_RELEASE_PCIE, bytes(4))
            assert await usb.bulk_in(0x81, 512, timeout=1) == b"B" * 512
        finally:
            await usb.aclose()
        ledger.assert_empty()


async def test_a_transfer_the_device_never_answers_ends_by_its_own_timeout(
    emulated: EmulatedBridge, server: SimServer[SimBridge]
):
    ledger = Ledger()
    with anyio.fail_after(LIMIT), use_ledger(ledger):
        usb = await open_pyusb_bridge(timeout=5)
        try:
            server.run(server.device.plan.add, FaultRule(Fault.USB_TIMEOUT, at=1))
            started = time.monotonic()
            with pytest.raises(UsbTransferTimeout) as info:
                await usb.bulk_in(0x81, 512, timeout=0.1)
            took = time.monotonic() - started
            ledger.assert_empty()  # pyusb's own timeout (the time left) ended the call
        finally:
            await usb.aclose()
    assert info.value.layer is Layer.USB_TRANSFER and not info.value.in_flight
    assert 0.1 <= info.value.elapsed < 0.5 and took < 0.6


async def test_an_unplug_is_device_lost_and_stays_so(
    emulated: EmulatedBridge, server: SimServer[SimBridge]
):
    with anyio.fail_after(LIMIT):
        usb = await open_pyusb_bridge(timeout=5)
        try:
            server.run(server.device.plan.add, FaultRule(Fault.DISCONNECT, at=1, count=math.inf))
            with pytest.raises(DeviceLost) as info:
                await usb.control_in(CONTROL_IN, 0xE4, FENCE_XDATA, 0, 1, timeout=1)
            assert info.value.layer is Layer.USB_TRANSFER
            with pytest.raises(DeviceLost, match="open it again"):
                await usb.control_in(CONTROL_IN, 0xE4, FENCE_XDATA, 0, 1, timeout=1)
        finally:
            await usb.aclose()


async def test_a_reset_forgets_what_was_armed(emulated: EmulatedBridge):
    with anyio.fail_after(LIMIT):
        usb = await open_pyusb_bridge(timeout=5)
        try:
            await usb.control_out(CONTROL_OUT, 0xF2, 1 | 0x8000, 0 | 1 << 8, timeout=1)
            await usb.reset(timeout=2)
            await usb.control_out(CONTROL_OUT, 0xF2, 1, 0 | 1 << 8, timeout=1)
            await usb.bulk_out(0x02, b"w" * 512, timeout=1)
        finally:
            await usb.aclose()
