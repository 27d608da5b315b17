from __future__ import annotations

import asyncio
import math
import time

import anyio
import anyio.lowlevel
import pytest
import trio

from aio_runtime import now
from aio_runtime.testing import virtual_time

pytestmark = pytest.mark.anyio


async def test_a_long_sleep_passes_in_virtual_time():
    real_start = time.monotonic()
    async with virtual_time() as clock:
        start = clock.now()
        await anyio.sleep(30.0)
        assert clock.now() - start == pytest.approx(30.0)
        assert now() == clock.now()
    assert time.monotonic() - real_start < 5.0  # 30 virtual seconds, not 30 real ones


async def test_timers_fire_in_deadline_order():
    fired = []

    async def sleeper(delay):
        await anyio.sleep(delay)
        fired.append((delay, round(now() - start, 6)))  # past 2**24 s, timers run an ulp late

    async with virtual_time():
        start = now()
        async with anyio.create_task_group() as tg:
            for delay in (3.0, 1.0, 2.0):
                tg.start_soon(sleeper, delay)
    assert fired == [(1.0, 1.0), (2.0, 2.0), (3.0, 3.0)]


@pytest.mark.timeout(10)  # the failure this guards against is a loop that never idles
async def test_waits_that_sleep_what_is_left_of_a_deadline_reach_it_taking_turns():
    # The clock lands on a timer a rounding error before a deadline. Two waits that read the clock
    # and sleep what is left of it (as a cancel scope or a polling probe does) take turns, so the
    # loop is never idle: the deadline is still reached, not seen ahead forever.
    async with virtual_time():
        landing = now() + 1.0
        deadline = math.nextafter(landing, math.inf)
        reached = []

        async def wait_for_the_deadline(offset: int) -> None:
            await anyio.sleep_until(landing)
            for _ in range(offset):  # out of step with the other wait by one pass of the loop
                await anyio.lowlevel.checkpoint()
            while now() < deadline:  # noqa: ASYNC110 (the subject: a wait that reads the clock)
                await anyio.sleep(deadline - now())
            reached.append(now())

        async with anyio.create_task_group() as tg:
            tg.start_soon(wait_for_the_deadline, 0)
            tg.start_soon(wait_for_the_deadline, 1)
    assert reached == [deadline, deadline]


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_timer_never_runs_before_its_time(anyio_backend):
    loop = asyncio.get_running_loop()
    early = []

    def check(when: float) -> None:
        early.append(max(0.0, when - loop.time()))

    async with virtual_time():
        at = now() + 1.0
        for when in (at, at + 1e-10, at + 2e-10):  # within asyncio's clock resolution
            loop.call_at(when, check, when)
        await anyio.sleep(2.0)
    assert early == [0.0, 0.0, 0.0]


@pytest.mark.timeout(10)
async def test_timers_run_on_a_clock_far_from_zero():
    # A year of a monotonic clock: a clock resolution of a nanosecond is below its precision.
    async with virtual_time() as clock:
        clock.jump(365 * 86400.0)
        start = now()
        await anyio.sleep(0.001)
        with anyio.move_on_after(0.5) as scope:
            await anyio.sleep_forever()
        assert scope.cancelled_caught
        assert now() - start == pytest.approx(0.501, abs=1e-6)


async def test_the_clock_stays_monotonic_after_the_block():
    async with virtual_time():
        await anyio.sleep(100.0)
        inside = now()
    assert now() >= inside
    await anyio.sleep(0.001)
    assert now() > inside


async def test_jump_moves_the_clock_forward_only():
    async with virtual_time() as clock:
        start = clock.now()
        clock.jump(5.0)
        assert clock.now() - start == pytest.approx(5.0)
        with pytest.raises(ValueError):
            clock.jump(-1)


async def test_virtual_time_does_not_nest():
    async with virtual_time():
        with pytest.raises(RuntimeError, match="already active"):
            async with virtual_time():
                pass


def test_trio_without_a_mock_clock_is_refused_with_a_clear_error():
    async def main():
        async with virtual_time():
            pass

    with pytest.raises(RuntimeError, match="MockClock"):
        trio.run(main)


async def test_work_on_a_worker_thread_is_jumped_past_unless_the_loop_waits_for_it():
    from aio_runtime import Completion, UsbTransferTimeout, wait_complete

    async def blocking_call_with_timeout(threshold: float) -> str:
        done: Completion[str] = Completion()
        setter = done.threadsafe_setter()

        def work() -> None:
            time.sleep(0.02)  # a blocking library call, 20 ms of real time
            setter.set_result("ok")

        async with virtual_time(autojump_threshold=threshold):
            async with anyio.create_task_group() as tg:
                tg.start_soon(anyio.to_thread.run_sync, work)
                try:
                    return await wait_complete(
                        done, awaited="pyusb bulk read", error=UsbTransferTimeout, timeout=1.0
                    )
                except UsbTransferTimeout:
                    return "timed out"

    assert await blocking_call_with_timeout(0.0) == "timed out"  # as documented
    assert await blocking_call_with_timeout(0.5) == "ok"


async def test_threads_busy_holds_for_a_live_worker_thread_entry_only():
    from aio_runtime import Ledger, LedgerKind
    from aio_runtime.testing import threads_busy

    ledger = Ledger()
    busy = threads_busy(ledger)
    transfer = ledger.open(LedgerKind.USB_TRANSFER, "bulk in 0x81")
    assert not busy()
    for kind in (LedgerKind.WORKER_THREAD, "worker thread"):
        call = ledger.open(kind, "onnxruntime run")
        assert busy()
        ledger.close(call)
        assert not busy()
    ledger.close(transfer)


# -- a plain virtual_time() around work on threads: the timeout says what to do ------------------


def _blocked_call_timing_out(hold) -> BaseException:
    """A run_in_thread call that blocks until released, bounded by 1 s, under virtual time (with
    ``hold``, or plain): the error that leaves the block."""
    import asyncio
    import threading

    from aio_runtime import Ledger, ModelTimeout, run_in_thread, use_ledger

    release = threading.Event()

    async def main() -> None:
        options = {} if hold is None else {"hold": hold(), "hold_limit": 0.05}
        async with virtual_time(**options):
            await run_in_thread(
                lambda: release.wait(10), awaited="a blocking call", error=ModelTimeout, timeout=1
            )

    try:
        with use_ledger(Ledger()):
            asyncio.run(main())
    except ModelTimeout as exc:
        return exc
    finally:
        release.set()
    raise AssertionError("the call did not time out")


def test_a_timeout_after_the_clock_jumped_past_a_thread_names_the_recipe():
    error = _blocked_call_timing_out(hold=None)
    (note,) = [n for n in getattr(error, "__notes__", []) if "virtual time" in n]
    assert "while work ran on a thread" in note
    assert "virtual_time(autojump_threshold=0.005, hold=threads_busy())" in note


def test_a_held_clock_that_gave_way_adds_no_note():
    from aio_runtime.testing import threads_busy

    error = _blocked_call_timing_out(hold=threads_busy)
    assert not [n for n in getattr(error, "__notes__", []) if "virtual time" in n]


async def test_a_timeout_with_no_thread_at_work_adds_no_note():
    from aio_runtime import SignalTimeout, TimelineSignal

    with pytest.raises(SignalTimeout) as info:
        async with virtual_time():
            await TimelineSignal(name="gpu").wait(1, timeout=30.0)
    assert not getattr(info.value, "__notes__", [])
