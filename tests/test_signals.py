from __future__ import annotations

import anyio
import numpy as np
import pytest

from aio_runtime import (
    BudgetExhausted,
    Layer,
    SignalTimeout,
    TimelineSignal,
    deadline_scope,
    now,
)
from aio_runtime.testing import play_script, virtual_time

pytestmark = pytest.mark.anyio

EPS = 1e-9  # float rounding of virtual clock arithmetic


async def test_wait_returns_when_the_device_stores_the_value():
    signal = TimelineSignal(name="compute")
    async with virtual_time(), anyio.create_task_group() as tg:
        tg.start_soon(play_script, signal, [(0.25, 1), (0.5, 2)])
        start = now()
        assert await signal.wait(2, timeout=1.0) == 2
        assert 0.5 - EPS <= now() - start <= 0.51


async def test_signal_timeout_reports_expected_and_last_observed_value():
    signal = TimelineSignal(name="compute")
    async with virtual_time(), anyio.create_task_group() as tg:
        tg.start_soon(play_script, signal, [(1.0, 3)])
        with pytest.raises(SignalTimeout) as info:
            await signal.wait(5, timeout=30.0)
    exc = info.value
    assert exc.layer is Layer.GPU_QUEUE
    assert (exc.expected, exc.observed) == (5, 3)
    assert exc.elapsed == pytest.approx(30.0)
    assert "timeline signal 'compute' >= 5" in str(exc)


async def test_signal_wait_inside_a_frame_budget_reports_the_budget():
    signal = TimelineSignal(name="compute")
    async with virtual_time():
        with deadline_scope(0.05, name="frame 3"):
            with pytest.raises(BudgetExhausted) as info:
                await signal.wait(1, timeout=30.0)
    assert info.value.budget == "frame 3"
    assert info.value.observed == 0


async def test_signal_reads_the_shared_buffer_not_a_copy():
    page = np.zeros(4, dtype=np.uint64)
    signal = TimelineSignal(page, offset=16, name="slot 2")
    page[2] = 77
    assert signal.value == 77
    signal.set(78)
    assert page[2] == 78
    raw = bytearray(16)
    TimelineSignal(raw).set(0x0102030405060708)
    assert bytes(raw[:8]) == bytes.fromhex("0807060504030201")  # little-endian u64


def test_64_bit_compare_uses_the_whole_value():
    signal = TimelineSignal()
    signal.set(0x1_0000_0002)
    assert signal.reached(3)
    assert signal.reached(0x1_0000_0002)
    assert not signal.reached(0x1_0000_0003)


def test_32_bit_compare_is_unsigned_on_the_low_dword_as_gpus_do():
    signal = TimelineSignal(compare_bits=32)
    signal.set(0x1_0000_0002)
    assert not signal.reached(3)  # low dword 2 < 3, whatever the high dword says
    assert signal.reached(0x7_0000_0002)
    signal.set(0xFFFF_FFFF)
    assert signal.reached(0x8000_0000)  # unsigned: 0xffffffff is not negative


async def test_32_bit_wait_completes_on_the_low_dword():
    signal = TimelineSignal(compare_bits=32, name="sdma")
    signal.set(0x5_0000_0009)
    assert await signal.wait(9, timeout=0.0) == 0x5_0000_0009


@pytest.mark.parametrize(
    ("memory", "offset", "message"),
    [
        (bytes(16), 0, "read-only"),
        (bytearray(8), 8, "8 bytes at offset 8"),
        (bytearray(16), 4, "multiple of 8"),
    ],
)
def test_signal_rejects_unusable_memory(memory, offset, message):
    with pytest.raises(ValueError, match=message):
        TimelineSignal(memory, offset=offset)


def test_signal_values_must_fit_64_bits():
    signal = TimelineSignal()
    for bad in (-1, 1 << 64):
        with pytest.raises(ValueError, match="64 bits"):
            signal.set(bad)
    with pytest.raises(ValueError):
        TimelineSignal(compare_bits=16)


async def test_fence_is_one_point_on_the_timeline():
    signal = TimelineSignal(name="copy")
    fence = signal.fence(2)
    assert not fence.done()
    async with virtual_time(), anyio.create_task_group() as tg:
        tg.start_soon(play_script, signal, [(0.1, 1), (0.2, 2)])
        assert await fence.wait(timeout=1.0) == 2
    assert fence.done()
    assert "done=True" in repr(fence)
