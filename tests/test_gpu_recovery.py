"""What a device session does to come back quickly after a fault: SMU messages re-sent while
unanswered, the bridge's liveness check, and the close of a session whose device no longer
answers. In virtual time, over the in-process simulator."""

from __future__ import annotations

import math

import anyio
import pytest
from gpu_sim import FAST, SLACK, device, reopen

from aio_runtime import DeviceLost, FirmwareTimeout, Ledger, ReadinessLayer, now, use_ledger
from aio_runtime.testing import virtual_time
from transports.gpu import GpuSession, bridge_answers
from transports.protocol import gpu as hw
from transports.sim import Fault, FaultRule
from transports.sim.usb import SimUsbTransport

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def smu_messages(sim) -> list[int]:
    return [message for message, _ in sim.gpu.smu.messages]


async def test_an_smu_message_left_unanswered_is_sent_again_and_the_boot_goes_on():
    async with virtual_time(), device(FaultRule(Fault.SMU_NO_RESPONSE, at=1)) as sim:
        start = now()
        gpu = await reopen(sim)
        took = now() - start
        await gpu.aclose()
    assert smu_messages(sim)[:2] == [hw.SmuMessage.DRIVER_TABLE_HIGH] * 2
    assert took <= FAST.smu_probe_timeout + SLACK  # not the firmware bound (2 s)


async def test_an_smu_that_comes_back_mid_boot_is_answered_within_a_probe_period():
    quiet = 0.75
    async with virtual_time(), device() as sim:
        sim.plan.add(FaultRule(Fault.SMU_NO_RESPONSE, window=(0, quiet)))
        start = now()
        gpu = await reopen(sim)
        took = now() - start
        await gpu.aclose()
    assert quiet <= took <= quiet + FAST.smu_probe_timeout + SLACK
    sends = smu_messages(sim).count(hw.SmuMessage.DRIVER_TABLE_HIGH)
    assert sends == pytest.approx(quiet / FAST.smu_probe_timeout, abs=2)


async def test_an_smu_that_never_answers_fails_the_boot_within_the_firmware_bound():
    ledger = Ledger()
    rule = FaultRule(Fault.SMU_NO_RESPONSE, at=1, count=math.inf)
    async with virtual_time(), device(rule) as sim:
        start = now()
        with use_ledger(ledger), pytest.raises(FirmwareTimeout) as info:
            await reopen(sim)
        assert now() - start <= FAST.firmware_timeout + SLACK
    assert info.value.timeout == FAST.firmware_timeout
    assert "sent " in info.value.message and "unanswered for 0.1 s" in info.value.message
    ledger.assert_empty()


async def test_the_bridge_answers_its_liveness_check_until_it_stops_answering():
    ledger = Ledger()
    async with virtual_time(), device() as sim:
        usb = SimUsbTransport(sim.bridge)
        with use_ledger(ledger):
            assert await bridge_answers(usb, timeout=0.05)
            sim.plan.add(FaultRule(Fault.USB_TIMEOUT, at=1, count=math.inf))
            start = now()
            assert not await bridge_answers(usb, timeout=0.05)
            assert now() - start == pytest.approx(0.05, abs=1e-3)  # its own short bound
            sim.plan.clear()
            assert await bridge_answers(usb, timeout=0.05)
            sim.plan.add(FaultRule(Fault.DISCONNECT, at=1))
            with pytest.raises(DeviceLost):
                await bridge_answers(usb, timeout=0.05)  # this transport is done for
            assert await bridge_answers(SimUsbTransport(sim.bridge), timeout=0.05)
    ledger.assert_empty()  # the timed-out read was cancelled and drained


async def test_abandoning_a_session_sends_nothing_releases_everything_and_the_next_boot_is_full():
    ledger = Ledger()
    async with virtual_time(), device() as sim:
        with use_ledger(ledger):
            gpu = await GpuSession.open(SimUsbTransport(sim.bridge), config=FAST)
            await gpu.alloc(4096)
            gpu.map_host(bytearray(64))
            sim.plan.add(FaultRule(Fault.USB_TIMEOUT, at=1, count=math.inf))
            sent = len(sim.plan.fired)
            start = now()
            with anyio.fail_after(1):
                await gpu.abandon()
            assert now() == start  # no transfer waited on
            assert len(sim.plan.fired) == sent  # none was even sent
            assert not gpu.readiness.is_up(ReadinessLayer.DEVICE_ONLINE)
            assert gpu.heap.statistics().used == 0
            await gpu.abandon()  # once is enough
            await gpu.aclose()
            with pytest.raises(DeviceLost):
                await gpu.alloc(16)
            sim.plan.clear()
            second = await reopen(sim)
            assert second.boot_log.mode == "full"  # SCRATCH_REG6 still said "in use"
            assert "SOC: mode-1 reset (firmware was running)" in second.boot_log.steps
            await second.aclose()
        ledger.assert_empty()
