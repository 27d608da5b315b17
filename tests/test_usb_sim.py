"""The simulated USB backend: every transfer bounded, every failure typed and layered."""

from __future__ import annotations

import gc
import math
import weakref

import anyio
import anyio.lowlevel
import pytest
from fake_pcie import FakeGpu

from aio_runtime import (
    IMMEDIATE_BURST,
    BudgetExhausted,
    DeviceLost,
    Layer,
    UnboundedWaitError,
    UsbTransferTimeout,
    deadline_scope,
)
from aio_runtime.testing import virtual_time
from transports.protocol.bridge import FENCE_XDATA
from transports.sim import Fault, FaultPlan, FaultRule
from transports.sim import usb as sim_usb
from transports.sim.bridge import SimBridge
from transports.sim.urb import SimUrb, UrbStatus
from transports.sim.usb import SimUsbTransport
from transports.usb import CONTROL_IN, CONTROL_OUT, ShortTransfer, UsbStall

pytestmark = pytest.mark.anyio


def transport(*rules: FaultRule) -> tuple[SimUsbTransport, FaultPlan]:
    plan = FaultPlan(rules)
    return SimUsbTransport(SimBridge(FakeGpu(), plan=plan)), plan


async def test_an_sram_round_trip_through_the_transport():
    usb, _ = transport()
    wire = bytes(range(256)) * 64  # one 16 KiB slot
    await usb.control_out(CONTROL_OUT, 0xF2, len(wire) // 512, 0 | 1 << 8, timeout=1)
    await usb.bulk_out(0x02, wire, timeout=1)
    usb.bridge.dma_write(0x82200C, bytes(4))  # (no read armed yet: releases nothing)
    await usb.control_out(CONTROL_OUT, 0xF2, len(wire) // 512 | 0x8000, 0 | 1 << 8, timeout=1)
    usb.bridge.dma_write(0x82200C, bytes(4))  # the GPU releases the armed read
    assert await usb.bulk_in(0x81, len(wire), timeout=1) == wire


async def test_a_transfer_the_device_never_answers_times_out_typed():
    usb, _ = transport(FaultRule(Fault.USB_TIMEOUT, at=1))
    async with virtual_time():
        with pytest.raises(UsbTransferTimeout) as info:
            await usb.control_in(CONTROL_IN, 0xE4, FENCE_XDATA, 0, 1, timeout=1.0)
    exc = info.value
    assert exc.layer is Layer.USB_TRANSFER
    assert exc.elapsed == pytest.approx(1.0)
    assert exc.awaited == "control IN 0xe4 (value 0xa800, 1 bytes)"


async def test_a_frame_budget_bounds_a_transfer():
    usb, _ = transport(FaultRule(Fault.USB_TIMEOUT, at=1))
    async with virtual_time():
        with deadline_scope(0.05, name="frame 3"):
            with pytest.raises(BudgetExhausted) as info:
                await usb.bulk_in(0x81, 512, timeout=10.0)
    assert info.value.layer is Layer.USB_TRANSFER


async def test_a_transfer_without_a_bound_is_refused():
    usb, plan = transport()
    with pytest.raises(UnboundedWaitError):
        await usb.control_in(CONTROL_IN, 0xE4, 0, 0, 1)
    assert plan.occurrences(Fault.DISCONNECT) == 0  # nothing reached the device


async def test_no_device_is_device_lost_and_the_handle_stays_dead_until_reopened():
    usb, plan = transport(FaultRule(Fault.DISCONNECT, at=1, count=math.inf))
    with pytest.raises(DeviceLost) as info:
        await usb.control_out(CONTROL_OUT, 0xE5, FENCE_XDATA, 0, timeout=1)
    assert info.value.layer is Layer.USB_TRANSFER
    plan.clear(Fault.DISCONNECT)
    with pytest.raises(DeviceLost, match="open it again"):
        await usb.control_out(CONTROL_OUT, 0xE5, FENCE_XDATA, 0, timeout=1)
    reopened = SimUsbTransport(usb.bridge)
    await reopened.control_out(CONTROL_OUT, 0xE5, FENCE_XDATA, 0, timeout=1)


async def test_a_reset_lets_the_host_start_again_from_a_known_state():
    usb, _ = transport()
    await usb.control_out(CONTROL_OUT, 0xF2, 1 | 0x8000, 0 | 1 << 8, timeout=1)
    with pytest.raises(UsbStall, match="no armed SRAM write"):
        await usb.bulk_out(0x02, b"x" * 512, timeout=1)  # a write where a read is armed
    await usb.control_out(CONTROL_OUT, 0xF2, 1 | 0x8000, 0 | 1 << 8, timeout=1)
    await usb.reset(timeout=1)
    await usb.control_out(CONTROL_OUT, 0xF2, 1, 0 | 1 << 8, timeout=1)


async def test_a_short_bulk_transfer_is_typed():
    usb, plan = transport()
    await usb.control_out(CONTROL_OUT, 0xF2, 1, 0 | 1 << 8, timeout=1)
    plan.add(FaultRule(Fault.SHORT_TRANSFER, at=1, params={"length": 100}))
    with pytest.raises(ShortTransfer) as info:
        await usb.bulk_out(0x02, b"z" * 512, timeout=1)
    assert (info.value.expected, info.value.actual) == (512, 100)


async def test_a_refused_request_is_a_stall():
    usb, _ = transport()
    with pytest.raises(UsbStall, match="no armed"):
        await usb.bulk_out(0x02, b"x" * 512, timeout=1)


async def test_fewer_bytes_than_required_is_a_short_transfer():
    usb, _ = transport(FaultRule(Fault.SHORT_TRANSFER, at=1, params={"length": 2}))
    with pytest.raises(ShortTransfer) as info:
        await usb.control_in(CONTROL_IN, 0xE4, 0, 0, 8, timeout=1)
    assert (info.value.expected, info.value.actual) == (8, 2)
    assert info.value.layer is Layer.USB_TRANSFER


async def test_a_closed_transport_refuses_transfers():
    usb, _ = transport()
    await usb.aclose()
    with pytest.raises(DeviceLost, match="closed"):
        await usb.control_in(CONTROL_IN, 0xE4, 0, 0, 1, timeout=1)


async def test_only_vendor_requests_reach_the_bridge():
    usb, _ = transport()
    with pytest.raises(ValueError, match="vendor"):
        await usb.control_in(0x80, 0x06, 0x0100, 0, 18, timeout=1)


async def test_leaving_async_with_closes_the_transport():
    usb, _ = transport()
    async with usb as opened:
        assert opened is usb
        await usb.control_out(CONTROL_OUT, 0xE5, FENCE_XDATA, 1, timeout=1)
    with pytest.raises(DeviceLost, match="transport closed"):
        await usb.control_out(CONTROL_OUT, 0xE5, FENCE_XDATA, 1, timeout=1)


async def test_a_completed_transfer_is_freed_without_the_garbage_collector(monkeypatch):
    """No reference cycle per transfer (URB, its callback, the completion holding the URB):
    cyclic garbage at the rate transfers go would make the collector's full passes, tens of
    milliseconds with the event loop held, frequent."""
    urbs: list[weakref.ref[SimUrb]] = []

    class TrackedUrb(SimUrb):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            urbs.append(weakref.ref(self))

    monkeypatch.setattr(sim_usb, "SimUrb", TrackedUrb)
    usb, _ = transport()
    gc.disable()
    try:
        for _ in range(3):
            await usb.control_in(CONTROL_IN, 0xE4, FENCE_XDATA, 0, 1, timeout=1.0)
        alive = [ref for ref in urbs if ref() is not None]
    finally:
        gc.enable()
    assert len(urbs) == 3 and alive == []


async def test_a_burst_of_transfers_that_complete_at_once_yields_to_the_loop_between():
    """The simulated device finishes a transfer inside its submit, so the task awaiting it need
    not wait; after ``IMMEDIATE_BURST`` such transfers in a row it yields once, and a neighbour
    on the loop runs (without the budget it would run only after all of them)."""
    usb, _ = transport()
    turns = 0
    stop = False

    async def neighbour() -> None:
        nonlocal turns
        while not stop:
            turns += 1
            await anyio.lowlevel.checkpoint()

    count = 5 * IMMEDIATE_BURST
    async with anyio.create_task_group() as tg:
        tg.start_soon(neighbour)
        await anyio.lowlevel.checkpoint()  # the neighbour has started
        before = turns
        for _ in range(count):
            await usb.control_in(CONTROL_IN, 0xE4, FENCE_XDATA, 0, 1, timeout=1.0)
        during = turns - before
        stop = True
    yields = count // IMMEDIATE_BURST
    assert yields - 1 <= during <= yields + 1  # (trio may run the neighbour a batch late)


def test_a_urb_lets_go_of_its_callback_once_it_has_called_it():
    calls = []
    urb = SimUrb(0x81, length=4, on_complete=calls.append)
    urb.complete(UrbStatus.COMPLETED, actual=4, result=b"abcd")
    urb.complete(UrbStatus.CANCELLED)  # ignored: the first outcome stands
    assert calls == [urb] and urb.on_complete is None and urb.status is UrbStatus.COMPLETED
