"""The test kit used the way an application team would: plain pytest-asyncio tests.

These tests are written against the public API only (``aio_runtime`` and ``aio_runtime.testing``)
and use the fixtures the ``aio_runtime`` pytest plugin registers (``ledger``, ``captured_logs``).
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

import aio_runtime as rt
from aio_runtime.testing import (
    Reply,
    ScriptedFirmware,
    TransitionRecorder,
    play_script,
    virtual_time,
)

SMU = rt.MailboxLayout(message=66, argument=82, response=90)


class MyDetector:
    """A stand-in for application code: runs one inference step on a device and reports health."""

    def __init__(self, signal: rt.TimelineSignal, availability: rt.AvailabilityMachine):
        self.signal = signal
        self.availability = availability
        self.timeline = 0
        self.vram = rt.RangeAllocator(1 << 20, name="vram")

    async def step(self) -> bool:
        self.timeline += 1
        scratch = self.vram.alloc(4096)
        try:
            with rt.log_context(frame_id=self.timeline, stage="model"):
                try:
                    await self.signal.wait(self.timeline, timeout=0.5)
                except rt.HardwareTimeout as exc:
                    rt.get_logger("detector").warning("step failed", error=str(exc))
                    self.availability.report_unavailable(str(exc))
                    return False
        finally:
            self.vram.free(scratch)
        self.availability.report_good()
        return True


@pytest.mark.asyncio
async def test_a_30_second_hardware_timeout_takes_no_real_time():
    signal = rt.TimelineSignal(name="gpu")
    loop = asyncio.get_running_loop()
    async with virtual_time():
        start = loop.time()
        with pytest.raises(rt.SignalTimeout) as info:
            await signal.wait(1, timeout=30.0)
        assert loop.time() - start == pytest.approx(30.0)
    assert info.value.layer is rt.Layer.GPU_QUEUE
    assert (info.value.expected, info.value.observed) == (1, 0)


@pytest.mark.asyncio
async def test_my_detector_goes_unavailable_on_a_hang_and_recovers(ledger, captured_logs):
    memory = np.zeros(2, dtype=np.uint64)
    availability = rt.AvailabilityMachine(recover_after=2)
    detector = MyDetector(rt.TimelineSignal(memory, name="gpu"), availability)
    with TransitionRecorder(availability) as recorder:
        async with virtual_time():
            # the device completes steps 1 and 2, is late with 3 (step 3 times out at 0.7 s)
            device = asyncio.create_task(
                play_script(detector.signal, [(0.1, 1), (0.2, 2), (0.9, 3), (1.0, 4)])
            )
            results = [await detector.step() for _ in range(4)]
            await device
    assert results == [True, True, False, True]
    assert [s.availability for s in recorder.states()] == [
        rt.Availability.UNAVAILABLE,
        rt.Availability.AVAILABLE,
        rt.Availability.UNAVAILABLE,
    ]
    assert "timeline signal 'gpu' >= 3" in recorder.states()[-1].reason
    failures = [e for e in captured_logs if e["event"] == "step failed"]
    assert len(failures) == 1 and failures[0]["frame_id"] == 3
    # the `ledger` fixture fails the test if the scratch allocations leaked


@pytest.mark.asyncio
async def test_firmware_that_answers_with_an_error_fails_fast():
    firmware = ScriptedFirmware(SMU, replies={0x2A: Reply(code=0xFF, after=0.01)})
    mailbox = rt.Mailbox(firmware, SMU, name="SMU", timeout=10.0, codes={0xFF: "failed"})
    async with virtual_time() as clock:
        start = clock.now()
        with pytest.raises(rt.FirmwareError) as info:
            await mailbox.send(0x2A)
        assert clock.now() - start < 0.1
    assert info.value.code == 0xFF


@pytest.mark.asyncio
async def test_frame_budget_exhaustion_is_not_a_hardware_timeout():
    signal = rt.TimelineSignal(name="gpu")
    async with virtual_time():
        with rt.deadline_scope(0.05, name="frame 1"):
            with pytest.raises(TimeoutError) as info:
                await signal.wait(1, timeout=1.0)
    assert isinstance(info.value, rt.BudgetExhausted)
    assert not isinstance(info.value, rt.HardwareTimeout)
