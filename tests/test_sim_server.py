"""The threaded mode: the simulation on its own thread, reached through the same transport."""

from __future__ import annotations

import contextlib
import os
import threading

import pytest
from fake_pcie import FakeGpu
from gpu_sim import ADD_ONE, FAST, device

from aio_runtime import Ledger, UsbTransferTimeout, use_ledger
from transports.gpu import GpuSession
from transports.sim import Fault, FaultPlan, FaultRule, SimBridge
from transports.sim.server import SimServer
from transports.sim.usb import SimUsbTransport
from transports.usb import CONTROL_IN, CONTROL_OUT

pytestmark = pytest.mark.anyio


@contextlib.asynccontextmanager
async def bridge_on_this_loop():
    yield SimBridge(FakeGpu(), plan=FaultPlan())


async def test_transfers_cross_to_the_simulation_thread_and_back():
    with SimServer(bridge_on_this_loop) as server:
        bridge = server.device
        seen = []
        bridge.on_sram_write = lambda offset, length: seen.append(threading.current_thread().name)
        usb = SimUsbTransport(bridge, call=server.call)
        await usb.control_out(CONTROL_OUT, 0xF2, 1, 0 | 1 << 8, timeout=5)
        await usb.bulk_out(0x02, b"q" * 512, timeout=5)
        assert await usb.control_in(CONTROL_IN, 0xE4, 0xA800, 0, 2, timeout=5) == b"\0\0"
        assert server.run(lambda: bytes(bridge.sram[:4])) == b"qqqq"
        assert seen == ["sim-server"]


async def test_a_hung_transfer_is_discarded_on_the_simulation_thread():
    ledger = Ledger()
    with SimServer(bridge_on_this_loop) as server, use_ledger(ledger):
        server.run(server.device.plan.add, FaultRule(Fault.USB_TIMEOUT, at=1))
        usb = SimUsbTransport(server.device, call=server.call)
        with pytest.raises(UsbTransferTimeout) as info:
            await usb.control_in(CONTROL_IN, 0xE4, 0, 0, 1, timeout=0.05)
        assert not info.value.in_flight  # the discard came back before the error
    ledger.assert_empty()


def test_a_factory_that_fails_is_reported_by_start():
    @contextlib.asynccontextmanager
    async def broken():
        raise OSError("no such device")
        yield

    with pytest.raises(RuntimeError, match="failed to start"):
        SimServer(broken).start()


async def test_a_gpu_session_against_the_simulator_on_its_own_thread():
    data = os.urandom(600_000)
    with SimServer(device) as server:
        usb = SimUsbTransport(server.device.bridge, call=server.call)
        async with await GpuSession.open(usb, config=FAST) as gpu:
            buffer = await gpu.alloc(len(data))
            await gpu.copy_in(buffer, data)
            assert bytes(await gpu.copy_out(buffer)) == data
            await gpu.run_kernel(ADD_ONE, [buffer, buffer, 16], reads=[buffer], writes=[buffer])
            head = bytes(await gpu.copy_out(buffer, 16))
            assert head == bytes((b + 1) % 256 for b in data[:16])
