from __future__ import annotations

import itertools

import anyio
import numpy as np
import pytest

from aio_runtime import (
    BudgetExhausted,
    FirmwareError,
    FirmwareTimeout,
    Layer,
    Mailbox,
    MailboxLayout,
    MemoryRegisters,
    SignalTimeout,
    WaitBound,
    deadline_scope,
    now,
    wait_register,
    wait_until,
)
from aio_runtime.testing import Reply, ScriptedFirmware, ScriptedProbe, virtual_time

pytestmark = pytest.mark.anyio

EPS = 1e-9  # float rounding of virtual clock arithmetic

SMU = MailboxLayout(message=66, argument=82, response=90)
CODES = {1: "OK", 0xFF: "failed", 0xFE: "unknown command", 0xFC: "busy"}


def smu(firmware: ScriptedFirmware, timeout: float = 10.0) -> Mailbox:
    return Mailbox(firmware, SMU, name="SMU", timeout=timeout, codes=CODES)


async def test_send_writes_argument_then_message_and_returns_on_success():
    firmware = ScriptedFirmware(SMU, default=Reply(code=1, after=0.002))
    async with virtual_time():
        assert await smu(firmware).send(0x06, 0x1234) == 1
    assert [(msg, arg) for _, msg, arg in firmware.requests] == [(0x06, 0x1234)]
    assert firmware.words[SMU.message] == 0x06
    assert firmware.words[SMU.response] == 1


async def test_error_code_raises_firmware_error_at_once_not_after_the_timeout():
    firmware = ScriptedFirmware(SMU, replies={0x20: Reply(code=0xFE, after=0.003)})
    async with virtual_time():
        start = now()
        with pytest.raises(FirmwareError) as info:
            await smu(firmware, timeout=10.0).send(0x20)
        elapsed = now() - start
    assert elapsed < 0.01
    assert info.value.code == 0xFE
    assert info.value.layer is Layer.FIRMWARE
    assert "0xfe (unknown command)" in str(info.value)
    assert "expected 0x1 (OK)" in str(info.value)


async def test_no_response_times_out_with_expected_and_observed_codes():
    firmware = ScriptedFirmware(SMU, default=ScriptedFirmware.never())
    async with virtual_time():
        with pytest.raises(FirmwareTimeout) as info:
            await smu(firmware, timeout=10.0).send(0x06)
    exc = info.value
    assert (exc.expected, exc.observed) == (1, 0)
    assert exc.elapsed == pytest.approx(10.0)
    assert "SMU mailbox response to message 0x6" in str(exc)


async def test_per_send_timeout_and_frame_budget_both_bound_the_response():
    firmware = ScriptedFirmware(SMU, default=ScriptedFirmware.never())
    mailbox = smu(firmware, timeout=10.0)
    async with virtual_time():
        with pytest.raises(FirmwareTimeout) as info:
            await mailbox.send(0x06, timeout=0.1)
        assert info.value.timeout == 0.1
        with deadline_scope(0.02, name="boot step"):
            with pytest.raises(BudgetExhausted):
                await mailbox.send(0x06)


async def test_sends_are_serialised():
    firmware = ScriptedFirmware(SMU, default=Reply(code=1, after=0.5))
    mailbox = smu(firmware)
    async with virtual_time(), anyio.create_task_group() as tg:
        for message in (1, 2, 3):
            tg.start_soon(mailbox.send, message)
    times = [t for t, _, _ in firmware.requests]
    assert len(times) == 3
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert all(gap >= 0.5 - EPS for gap in gaps), gaps


async def test_read_argument_returns_the_firmware_reply_argument():
    firmware = ScriptedFirmware(SMU, replies={0x0E: Reply(code=1, argument=2100)})
    async with virtual_time():
        assert await smu(firmware).send(0x0E, 3, read_argument=True) == 2100


def test_success_and_pending_codes_must_differ():
    with pytest.raises(ValueError):
        Mailbox(MemoryRegisters(128), SMU, name="x", timeout=1, success=0, pending=0)


async def test_wait_register_compares_under_a_mask():
    bootloader = ScriptedProbe.late(0x8000_0001, after=0.2)

    class Regs(MemoryRegisters):
        async def read(self, index: int) -> int:
            return bootloader()

    async with virtual_time():
        value = await wait_register(
            Regs(64),
            35,
            mask=0x8000_0000,
            value=0x8000_0000,
            awaited="PSP bootloader ready",
            timeout=10.0,
        )
        assert value == 0x8000_0001
        with pytest.raises(FirmwareTimeout) as info:
            await wait_register(
                MemoryRegisters(128),
                81,
                mask=0xFFFF_FFFF,
                value=1,
                awaited="PSP sOS alive",
                timeout=10.0,
            )
    assert info.value.awaited == "PSP sOS alive"


async def test_wait_register_can_run_under_a_shared_bound_or_its_own_error():
    regs = MemoryRegisters(16)
    async with virtual_time():
        bound = WaitBound(awaited="queue bring-up", error=SignalTimeout, timeout=2.0)
        start = now()
        with pytest.raises(SignalTimeout) as shared:
            await wait_register(regs, 3, value=1, awaited="queue 3 active", within=bound)
        assert now() - start == pytest.approx(2.0)
        with pytest.raises(SignalTimeout):
            await wait_register(
                regs, 3, value=1, awaited="doorbell", error=SignalTimeout, timeout=0.1
            )
    assert (shared.value.awaited, shared.value.expected) == ("queue 3 active", 1)


async def test_memory_registers_check_index_and_width():
    regs = MemoryRegisters(np.zeros(4, dtype=np.uint32))
    with pytest.raises(IndexError):
        await regs.read(4)
    with pytest.raises(ValueError):
        await regs.write(0, 1 << 32)
    with pytest.raises(ValueError):
        MemoryRegisters(np.zeros(4, dtype=np.int64))


async def test_a_queued_send_is_bounded_by_its_own_timeout_including_the_wait_for_the_lock():
    firmware = ScriptedFirmware(SMU, default=Reply(code=1, after=5.0))
    mailbox = smu(firmware, timeout=10.0)
    async with virtual_time(), anyio.create_task_group() as tg:
        tg.start_soon(mailbox.send, 0x01)
        await wait_until(
            lambda: len(firmware.requests),
            bool,
            awaited="first send written",
            error=FirmwareTimeout,
            timeout=1.0,
        )
        start = now()
        with pytest.raises(FirmwareTimeout) as info:
            await mailbox.send(0x02, timeout=0.5)
        assert now() - start == pytest.approx(0.5)
    assert info.value.timeout == 0.5
    assert "mailbox free (another send in progress)" in info.value.awaited


async def test_a_hung_register_write_is_bounded():
    class HungWrites(MemoryRegisters):
        async def write(self, index: int, value: int) -> None:
            await anyio.Event().wait()

    mailbox = Mailbox(HungWrites(128), SMU, name="SMU", timeout=10.0)
    async with virtual_time():
        with deadline_scope(0.05, name="boot"):
            with pytest.raises(BudgetExhausted):
                await mailbox.send(0x06)
        with pytest.raises(FirmwareTimeout) as info:
            await mailbox.send(0x06, timeout=0.1)
    assert info.value.elapsed == pytest.approx(0.1)


async def test_after_a_timeout_the_next_send_waits_for_the_outstanding_answer_first():
    firmware = ScriptedFirmware(SMU, replies={0x10: Reply(code=1, after=0.3)})
    mailbox = smu(firmware)
    async with virtual_time():
        start = now()
        with pytest.raises(FirmwareTimeout):
            await mailbox.send(0x10, timeout=0.2)
        assert await mailbox.send(0x20) == 1
        assert now() - start >= 0.3 - EPS
    # firmware handled both messages, in order, and never received one while busy
    assert [msg for _, msg, _ in firmware.requests] == [0x10, 0x20]
    assert firmware.ignored == []
    assert firmware.requests[1][0] - start >= 0.3 - EPS


async def test_scripted_firmware_ignores_a_message_sent_while_it_is_busy():
    firmware = ScriptedFirmware(SMU, default=Reply(code=1, after=1.0))
    async with virtual_time():
        await firmware.write(SMU.message, 0x10)
        await firmware.write(SMU.message, 0x20)
    assert [msg for _, msg, _ in firmware.requests] == [0x10]
    assert [msg for _, msg, _ in firmware.ignored] == [0x20]


async def test_a_send_cut_off_before_its_message_was_written_does_not_wedge_the_mailbox():
    class SlowWrites(ScriptedFirmware):
        async def write(self, index: int, value: int) -> None:
            await anyio.sleep(0.005)  # every register write is a transfer over the link
            await super().write(index, value)

    firmware = SlowWrites(SMU, default=Reply(code=1, after=0.001))
    mailbox = smu(firmware)
    async with virtual_time():
        with deadline_scope(0.008, name="frame 1"):
            with pytest.raises(BudgetExhausted):
                await mailbox.send(0x10)
        assert firmware.requests == []  # the message never reached the firmware
        assert await mailbox.send(0x11) == 1
    assert [msg for _, msg, _ in firmware.requests] == [0x11]


async def test_scripted_firmware_takes_a_message_written_after_its_answer_was_due():
    firmware = ScriptedFirmware(SMU, default=Reply(code=1, after=0.1))
    async with virtual_time():
        await firmware.write(SMU.message, 0x10)
        await anyio.sleep(0.2)
        await firmware.write(SMU.message, 0x20)
    assert [msg for _, msg, _ in firmware.requests] == [0x10, 0x20]
    assert firmware.ignored == []
