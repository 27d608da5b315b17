"""Off-loop probing: a memory watcher thread detects plain stores and wakes the awaiting task.

Real time (a thread is involved), short timeouts, generous margins.
"""

from __future__ import annotations

import threading

import anyio
import numpy as np
import pytest

from aio_runtime import (
    BudgetExhausted,
    MemoryWatcher,
    SignalTimeout,
    TimelineSignal,
    WatcherStopped,
    deadline_scope,
    wait_until,
)

pytestmark = pytest.mark.anyio


@pytest.fixture
def watcher():
    with MemoryWatcher("test") as w:
        yield w


async def watch_word(memory: np.ndarray, watcher: MemoryWatcher, *, timeout: float) -> int:
    """Wait on the watcher until word 0 of ``memory`` is non-zero."""
    return await wait_until(
        lambda: int(memory[0]),
        bool,
        awaited="word 0 != 0",
        error=SignalTimeout,
        timeout=timeout,
        watcher=watcher,
    )


def store_later(memory: np.ndarray, index: int, value: int, delay: float) -> threading.Timer:
    timer = threading.Timer(delay, memory.__setitem__, args=(index, value))
    timer.start()
    return timer


def store_once_watched(
    monkeypatch: pytest.MonkeyPatch,
    watcher: MemoryWatcher,
    memory: np.ndarray,
    stores: dict[int, int],
) -> threading.Thread:
    """Make ``stores`` (index: value) from another thread once as many watches as stores have
    begun on ``watcher``: a store made before a wait begins is found by its first read, on the
    loop, and the watcher is not involved (nor, for that wait, ever called). A watch that never
    begins holds the stores back 10 s at most."""
    begun = threading.Semaphore(0)
    watch = watcher.watch

    def counted(*args, **kwargs):
        begun.release()
        return watch(*args, **kwargs)

    monkeypatch.setattr(watcher, "watch", counted)

    def store() -> None:
        for _ in stores:
            begun.acquire(timeout=10.0)
        for index, value in stores.items():
            memory[index] = value

    thread = threading.Thread(target=store, name="store", daemon=True)
    thread.start()
    return thread


async def test_watcher_detects_a_store_from_another_thread(watcher, monkeypatch):
    memory = np.zeros(1, dtype=np.uint64)
    store_once_watched(monkeypatch, watcher, memory, {0: 9})
    value = await wait_until(
        lambda: int(memory[0]),
        lambda v: v >= 9,
        awaited="word >= 9",
        error=SignalTimeout,
        timeout=5.0,
        watcher=watcher,
    )
    assert value == 9
    assert watcher.statistics().pending == 0
    assert watcher.statistics().completed == 1


async def test_watched_wait_times_out_with_last_observed_value(watcher):
    memory = np.full(1, 4, dtype=np.uint64)
    with pytest.raises(SignalTimeout) as info:
        await wait_until(
            lambda: int(memory[0]),
            lambda v: v >= 5,
            awaited="word >= 5",
            error=SignalTimeout,
            timeout=0.05,
            expected=5,
            watcher=watcher,
        )
    assert (info.value.expected, info.value.observed) == (5, 4)
    assert info.value.elapsed >= 0.05
    assert watcher.statistics().pending == 0


async def test_cancelling_a_watched_wait_removes_the_watch(watcher):
    memory = np.zeros(1, dtype=np.uint64)
    started = anyio.Event()

    async def waiter():
        started.set()
        await watch_word(memory, watcher, timeout=60.0)

    async with anyio.create_task_group() as tg:
        tg.start_soon(waiter)
        await started.wait()
        await anyio.lowlevel.checkpoint()
        assert watcher.statistics().pending == 1
        tg.cancel_scope.cancel()
    assert watcher.statistics().pending == 0


async def test_many_waits_share_one_thread(watcher, monkeypatch):
    memory = np.zeros(8, dtype=np.uint64)
    results = {}

    async def wait_word(i: int):
        results[i] = await wait_until(
            lambda: int(memory[i]),
            bool,
            awaited=f"word {i}",
            error=SignalTimeout,
            timeout=5.0,
            watcher=watcher,
        )

    store_once_watched(monkeypatch, watcher, memory, {i: i + 1 for i in range(8)})
    async with anyio.create_task_group() as tg:
        for i in range(8):
            tg.start_soon(wait_word, i)
    assert results == {i: i + 1 for i in range(8)}
    assert [t.name for t in threading.enumerate()].count("memory-watcher-test") == 1


async def test_idle_watcher_does_not_sweep(watcher):
    memory = np.ones(1, dtype=np.uint64)
    await watch_word(memory, watcher, timeout=1.0)
    sweeps = watcher.statistics().sweeps
    await anyio.sleep(0.02)
    assert watcher.statistics().sweeps == sweeps


async def test_probe_exception_fails_the_waiter_not_the_watcher(watcher):
    def broken() -> int:
        raise OSError("unmapped")

    with pytest.raises(OSError, match="unmapped"):
        await wait_until(
            broken, bool, awaited="x", error=SignalTimeout, timeout=1.0, watcher=watcher
        )
    memory = np.ones(1, dtype=np.uint64)
    assert await watch_word(memory, watcher, timeout=1.0) == 1


async def test_watcher_refuses_async_probes(watcher):
    async def read() -> int:
        return 1

    with pytest.raises(TypeError, match="plain memory reads"):
        await wait_until(read, bool, awaited="x", error=SignalTimeout, timeout=1.0, watcher=watcher)


async def test_watched_inactivity_timeout_follows_progress(watcher):
    memory = np.zeros(1, dtype=np.uint64)
    timers = [store_later(memory, 0, v, 0.05 * v) for v in (1, 2, 3, 4)]
    signal = TimelineSignal(memory, name="slow", watcher=watcher, reset_on_progress=True)
    assert await signal.wait(4, timeout=0.12) == 4
    for timer in timers:
        timer.join()


async def test_closed_watcher_refuses_new_watches():
    watcher = MemoryWatcher("closed")
    watcher.close()
    with pytest.raises(WatcherStopped, match="closed"):
        await wait_until(
            lambda: 0, bool, awaited="x", error=SignalTimeout, timeout=1.0, watcher=watcher
        )


def test_watcher_policy_spins_then_backs_off_to_its_cap():
    watcher = MemoryWatcher("policy", spin=0.001, first_interval=50e-6, max_interval=0.0005)
    assert watcher._pause(0.0) == 0.0
    assert watcher._pause(0.0009) == 0.0
    assert watcher._pause(0.0011) == pytest.approx(50e-6)  # 1/16 of 0.1 ms is below the floor
    assert watcher._pause(0.005) == pytest.approx(0.00025)  # 1/16 of the 4 ms waited past the spin
    assert watcher._pause(5.0) == pytest.approx(0.0005)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"spin": -1},
        {"spin": 2.0},
        {"first_interval": 0},
        {"max_interval": 2.0},
        {"first_interval": 0.01, "max_interval": 0.001},
    ],
)
def test_watcher_rejects_a_nonsense_policy(kwargs):
    with pytest.raises(ValueError):
        MemoryWatcher("bad", **kwargs)


async def test_a_condition_that_already_holds_needs_no_thread_and_no_time(watcher):
    memory = np.full(1, 5, dtype=np.uint64)
    signal = TimelineSignal(memory, name="done", watcher=watcher)
    assert await signal.wait(5, timeout=0) == 5
    assert not watcher.statistics().running


async def test_a_watched_wait_inside_a_frame_budget_reports_the_budget(watcher):
    memory = np.full(1, 2, dtype=np.uint64)
    with deadline_scope(0.03, name="frame 8"):
        with pytest.raises(BudgetExhausted) as info:
            await TimelineSignal(memory, name="gpu", watcher=watcher).wait(3, timeout=5.0)
    assert info.value.budget == "frame 8"
    assert (info.value.expected, info.value.observed) == (3, 2)


async def test_probes_may_return_arrays(watcher):
    sentinels = np.zeros(2, dtype=np.uint32)
    timer = threading.Timer(0.005, sentinels.__setitem__, args=(slice(None), [7, 7]))
    timer.start()
    value = await wait_until(
        lambda: sentinels.copy(),
        lambda v: bool((v == 7).all()),
        awaited="both sentinels",
        error=SignalTimeout,
        timeout=5.0,
        watcher=watcher,
        reset_on_progress=True,
    )
    assert list(value) == [7, 7]
    timer.join()


async def test_closing_the_watcher_fails_pending_waits_at_once():
    watcher = MemoryWatcher("closing")
    memory = np.zeros(1, dtype=np.uint64)
    outcome = []

    async def waiter():
        try:
            await watch_word(memory, watcher, timeout=30.0)
        except WatcherStopped as exc:
            outcome.append(exc)

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(waiter)
            await anyio.sleep(0.01)
            watcher.close()
    assert len(outcome) == 1 and "closed" in str(outcome[0])


async def test_a_stopped_watcher_thread_fails_its_waiters_and_the_next_watch_restarts_it(watcher):
    memory = np.zeros(1, dtype=np.uint64)
    real_pause = watcher._pause

    def broken_pause(waited: float) -> float:
        raise SystemError("watcher thread bug")

    watcher._pause = broken_pause
    with pytest.raises(WatcherStopped, match="watcher thread bug"):
        await watch_word(memory, watcher, timeout=5.0)
    watcher._pause = real_pause
    store_later(memory, 0, 1, 0.005)
    assert await watch_word(memory, watcher, timeout=5.0) == 1


async def test_a_cancelled_watch_is_never_probed_again(watcher):
    calls = []

    def probe() -> int:
        calls.append(1)
        return 0

    with anyio.move_on_after(0.02):
        await wait_until(
            probe, bool, awaited="x", error=SignalTimeout, timeout=5.0, watcher=watcher
        )
    after_cancel = len(calls)
    await anyio.sleep(0.02)
    assert len(calls) == after_cancel


async def test_a_watched_probe_that_returns_an_awaitable_is_refused(watcher):
    from aio_runtime import MemoryRegisters

    regs = MemoryRegisters(4)
    with pytest.raises(TypeError, match="plain memory reads"):
        await wait_until(
            lambda: regs.read(0),
            bool,
            awaited="x",
            error=SignalTimeout,
            timeout=1.0,
            watcher=watcher,
        )
