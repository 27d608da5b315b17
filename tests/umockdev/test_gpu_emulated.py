"""The whole stack through real libusb: a device session against the simulated GPU behind the
simulated bridge, served as an emulated USB device — boot, a copy round trip, a kernel, and a USB
fault in the middle of a copy."""

from __future__ import annotations

import os

import anyio
import pytest
from gpu_sim import ADD_ONE, FAST, device

from aio_runtime import Layer, Ledger, UsbTransferTimeout, use_ledger
from transports.gpu import GpuSession
from transports.gpu.copy import CHUNK
from transports.sim import Fault, FaultRule
from transports.sim.server import SimServer
from transports.sim.umockdev import EmulatedBridge
from transports.usb.libusb_backend import LibusbContext, open_bridge

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]
LIMIT = 45.0


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the libusb backend's event integration is asyncio's


async def test_a_session_boots_copies_and_runs_a_kernel_through_libusb():
    data = os.urandom(2 * CHUNK + 7)
    with SimServer(device) as server, EmulatedBridge(server, server.device.bridge):
        with anyio.fail_after(LIMIT):
            async with LibusbContext() as context:
                usb = await open_bridge(context, timeout=5)
                async with await GpuSession.open(usb, config=FAST) as gpu:
                    assert gpu.boot_log.mode == "full"
                    buffer = await gpu.alloc(len(data))
                    await gpu.copy_in(buffer, data)
                    assert bytes(await gpu.copy_out(buffer)) == data
                    await gpu.run_kernel(ADD_ONE, [buffer, buffer, 8])
                    assert bytes(await gpu.copy_out(buffer, 8)) == bytes(
                        (b + 1) % 256 for b in data[:8]
                    )


async def test_a_usb_timeout_in_a_copy_is_typed_leaves_nothing_in_flight_and_recovers():
    data = os.urandom(CHUNK + 1)
    ledger = Ledger()
    with SimServer(device) as server, EmulatedBridge(server, server.device.bridge):
        with anyio.fail_after(LIMIT):
            async with LibusbContext() as context:
                usb = await open_bridge(context, timeout=5)
                async with await GpuSession.open(usb, config=FAST) as gpu:
                    buffer = await gpu.alloc(len(data))
                    plan = server.device.plan
                    # the 6th transfer of the copy: chunk 0's bulk OUT (after the fence reset,
                    # the program's stream request and data, the doorbell, the arm)
                    server.run(plan.add, FaultRule(Fault.USB_TIMEOUT, at=6))
                    with use_ledger(ledger), pytest.raises(UsbTransferTimeout) as info:
                        await gpu.copy_in(buffer, data)
                    assert info.value.layer is Layer.USB_TRANSFER
                    assert info.value.awaited.startswith("bulk OUT ep 0x02 (262144 bytes)")
                    assert info.value.elapsed < FAST.bulk_timeout + 1.0  # libusb's timers: real
                    ledger.assert_empty()
                    server.run(plan.clear)
                    await gpu.recover()
                    await gpu.copy_in(buffer, data)
                    assert bytes(await gpu.copy_out(buffer)) == data
