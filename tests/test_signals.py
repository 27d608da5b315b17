from __future__ import annotations

import anyio
import anyio.lowlevel
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from aio_runtime import (
    BudgetExhausted,
    Layer,
    SignalTimeout,
    TimelineSignal,
    WaitBound,
    deadline_scope,
    now,
    serial_reached,
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


# -- serial numbers ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "target", "bits", "reached"),
    [
        (5, 5, 8, True),
        (6, 5, 8, True),
        (4, 5, 8, False),
        (2, 0xFE, 8, True),  # wrapped past the target
        (0xFE, 2, 8, False),  # the target wrapped: still ahead
        (0x7F, 0, 8, True),  # less than half the range ahead
        (0x80, 0, 8, False),  # half the range: behind, not ahead
        (0x1_0000_0003, 0xFFFF_FFFF, 32, True),  # only the low bits count
        (0x7FFF_FFFF, 0, 32, True),
        (0x8000_0000, 0, 32, False),
    ],
)
def test_serial_numbers_compare_modulo_their_width(value, target, bits, reached):
    assert serial_reached(value, target, bits=bits) is reached


@given(st.integers(0, 0xFFFF_FFFF), st.integers(0, 0x7FFF_FFFF))
def test_a_serial_number_up_to_half_the_range_ahead_has_reached_its_target(target, ahead):
    assert serial_reached((target + ahead) & 0xFFFF_FFFF, target, bits=32)
    assert not serial_reached(target, (target + ahead + 1) & 0xFFFF_FFFF, bits=32)


def test_a_modular_32_bit_signal_counts_a_wrapped_value_as_past_its_target():
    signal = TimelineSignal(compare_bits=32, modular=True)
    signal.set(0x1_0000_0002)  # the low dword wrapped past 0xffff_fff0
    assert signal.reached(0xFFFF_FFF0)
    assert not TimelineSignal(compare_bits=32).reached(0xFFFF_FFF0, 0x1_0000_0002)
    signal.set(0xFFFF_FFF0)
    assert not signal.reached(0x1_0000_0002)


# -- a signal behind an async read ---------------------------------------------------------------


class Register:
    """A timeline word reached over a bus: every read is awaited and counted."""

    def __init__(self) -> None:
        self.value = 0
        self.reads = 0

    async def read(self) -> int:
        self.reads += 1
        await anyio.lowlevel.checkpoint()
        return self.value


async def test_a_signal_over_an_async_read_waits_through_it():
    register = Register()
    signal = TimelineSignal(read=register.read, name="compute", compare_bits=32, modular=True)

    async def advance() -> None:
        await anyio.sleep(0.25)
        register.value = 3

    async with virtual_time(), anyio.create_task_group() as tg:
        tg.start_soon(advance)
        start = now()
        assert await signal.wait(3, timeout=1.0) == 3
        assert now() - start >= 0.25 - EPS
    assert register.reads > 1
    assert await signal.read() == 3


async def test_a_signal_over_an_async_read_times_out_with_its_last_read():
    register = Register()
    register.value = 1
    signal = TimelineSignal(read=register.read, name="compute")
    async with virtual_time():
        with pytest.raises(SignalTimeout) as info:
            await signal.wait(2, timeout=0.5, awaited="compute timeline >= 2")
    assert (info.value.expected, info.value.observed) == (2, 1)
    assert info.value.awaited == "compute timeline >= 2"


async def test_a_read_that_fails_ends_the_wait_with_its_error():
    async def faulted() -> int:
        raise RuntimeError("the device is in its error state")

    signal = TimelineSignal(read=faulted)
    with pytest.raises(RuntimeError, match="error state"):
        await signal.wait(1, timeout=1.0)


async def test_a_signal_wait_can_share_a_bound_with_other_waits():
    signal = TimelineSignal(name="compute")
    async with virtual_time():
        bound = WaitBound(awaited="a frame's device work", error=SignalTimeout, timeout=0.2)
        with pytest.raises(SignalTimeout) as info:
            await signal.wait(1, within=bound)
    assert info.value.timeout == pytest.approx(0.2)


def test_a_signal_behind_an_async_read_has_no_value_to_look_at_nor_set():
    async def read() -> int:
        return 0

    signal = TimelineSignal(read=read, name="compute")
    for touch in (lambda: signal.value, lambda: signal.set(1), lambda: signal.reached(1)):
        with pytest.raises(TypeError, match=r"await signal\.read"):
            touch()
    assert signal.reached(1, observed=1)
    with pytest.raises(ValueError, match="takes no memory"):
        TimelineSignal(bytearray(16), read=read)


# -- a signal the host sets: woken by the set, never polled ------------------------------------


class CountedSignal(TimelineSignal):
    """A signal that counts its waits' reads: a wait checks each value it reads with reached()."""

    reads = 0

    def reached(self, target: int, observed: int | None = None) -> bool:
        if observed is not None:
            self.reads += 1
        return super().reached(target, observed)


async def test_a_host_set_wakes_a_3000_second_wait_which_reads_its_signal_at_most_twice():
    signal = CountedSignal(name="compute")
    async with virtual_time(), anyio.create_task_group() as tg:
        tg.start_soon(play_script, signal, [(2999.0, 1)])
        start = now()
        assert await signal.wait(1, timeout=3000.0) == 1
        assert now() - start == pytest.approx(2999.0)
    assert signal.reads <= 2


async def test_a_host_set_signal_that_is_never_set_is_read_at_the_start_and_at_the_bound():
    signal = CountedSignal(name="compute")
    async with virtual_time():
        with pytest.raises(SignalTimeout) as info:
            await signal.wait(1, timeout=3000.0)
    assert signal.reads == 2
    assert (info.value.expected, info.value.observed) == (1, 0)
    assert info.value.elapsed == pytest.approx(3000.0)


async def test_each_host_set_wakes_the_wait_once():
    signal = CountedSignal(name="compute")
    async with virtual_time(), anyio.create_task_group() as tg:
        tg.start_soon(play_script, signal, [(1.0, 1), (2.0, 2), (3.0, 3)])
        assert await signal.wait(3, timeout=10.0) == 3
    assert signal.reads == 4  # the first read, then one per set


async def test_a_set_from_another_thread_wakes_the_wait():
    signal = CountedSignal(name="compute")
    got = []

    async def waiter() -> None:
        got.append(await signal.wait(7, timeout=30.0))

    async with anyio.create_task_group() as tg:
        tg.start_soon(waiter)
        await anyio.wait_all_tasks_blocked()  # the wait has read 0 and sleeps
        await anyio.to_thread.run_sync(signal.set, 7)
    assert got == [7]
    assert signal.reads == 2


async def test_progress_by_the_host_restarts_an_inactivity_timeout():
    signal = TimelineSignal(name="compute", reset_on_progress=True)
    async with virtual_time(), anyio.create_task_group() as tg:
        tg.start_soon(play_script, signal, [(2.0, 1), (4.0, 2)])
        start = now()
        with pytest.raises(SignalTimeout) as info:
            await signal.wait(3, timeout=3.0)
        assert now() - start == pytest.approx(7.0)  # 3 s after the last progress, at 4 s
    assert info.value.observed == 2


async def test_a_store_into_memory_the_device_writes_is_still_seen_by_polling():
    memory = np.zeros(2, dtype=np.uint64)
    signal = CountedSignal(memory, name="compute")

    async def device() -> None:
        await anyio.sleep(0.25)
        memory[0] = 1  # a plain store: no set(), nothing announced

    async with virtual_time(), anyio.create_task_group() as tg:
        tg.start_soon(device)
        assert await signal.wait(1, timeout=1.0) == 1
    assert signal.reads > 2


def test_a_signal_on_its_own_slot_takes_no_watcher():
    from aio_runtime import MemoryWatcher

    with MemoryWatcher("gpu") as watcher, pytest.raises(ValueError, match="written only by set"):
        TimelineSignal(name="compute", watcher=watcher)
