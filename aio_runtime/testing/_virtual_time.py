"""Virtual time for tests: a 30 s hardware timeout in milliseconds.

Inside ``async with virtual_time():`` the running event loop's clock stops following the wall clock.
Whenever every task is blocked and the loop would sleep until its next timer, the clock jumps to
that timer instead. Timeouts therefore fire in the order and at the instants they would in real time,
deterministically, without waiting.

This is safe when everything that can wake a task lives on the event loop: timers, tasks, and
simulated hardware driven by them. Work on other threads (worker threads, a
:class:`~aio_runtime.watcher.MemoryWatcher`) does not hold the clock back: by the time a thread
finishes, a deadline may have been jumped past. ``autojump_threshold`` (real seconds) makes the loop
wait that long for I/O or a thread before jumping, as trio's ``MockClock`` does.

asyncio: the running selector event loop is switched in place (its clock and its selector are
wrapped), and switched back on exit with its clock kept monotonic. trio: the run must use
``trio.testing.MockClock`` (``anyio`` backend options ``{"clock": MockClock(rate=1)}``); the block sets
its rate to 0 and its autojump threshold, and restores both on exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import selectors
import weakref
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio.lowlevel

__all__ = ["VirtualClock", "virtual_time"]


class VirtualClock:
    """The clock the loop reads inside :func:`virtual_time`."""

    def __init__(
        self,
        now: Callable[[], float],
        jump: Callable[[float], None],
    ) -> None:
        self._now = now
        self._jump = jump

    def now(self) -> float:
        return self._now()

    def jump(self, seconds: float) -> None:
        """Move the clock forward by ``seconds`` (timers due by then fire on the next loop pass)."""
        if seconds < 0:
            raise ValueError(f"time only moves forward; got {seconds!r}")
        self._jump(seconds)


class _Counter:
    def __init__(self, start: float) -> None:
        self.value = start

    def now(self) -> float:
        return self.value

    def jump(self, seconds: float) -> None:
        self.value += seconds


class _AutojumpSelector:
    """Wraps a selector: when the loop would sleep ``timeout`` with no I/O ready, jump instead."""

    def __init__(self, inner: Any, counter: _Counter, autojump_threshold: float) -> None:
        self._inner = inner
        self._counter = counter
        self._threshold = autojump_threshold

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is None:
            # No timer pending: only I/O or another thread can wake the loop. Block for it.
            return self._inner.select(None)  # type: ignore[no-any-return]
        events = self._inner.select(0 if timeout <= 0 else min(self._threshold, timeout))
        if events or timeout <= 0:
            return events  # type: ignore[no-any-return]
        self._counter.jump(timeout)
        return []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _OffsetClock:
    """The loop's own clock plus a fixed offset: what the loop reads after a virtual-time block."""

    def __init__(self, base: Callable[[], float], offset: float) -> None:
        self.base = base
        self.offset = offset

    def __call__(self) -> float:
        return self.base() + self.offset


@contextlib.asynccontextmanager
async def _asyncio_virtual_time(
    loop: asyncio.AbstractEventLoop, autojump_threshold: float
) -> AsyncIterator[VirtualClock]:
    selector = getattr(loop, "_selector", None)
    if selector is None or not hasattr(selector, "select"):
        raise RuntimeError(
            "virtual_time() needs asyncio's selector event loop (the default on Linux); "
            f"{type(loop).__name__} has no selector to drive"
        )
    if isinstance(selector, _AutojumpSelector):
        raise RuntimeError("virtual_time() is already active on this loop")
    current = loop.time
    real_time = current.base if isinstance(current, _OffsetClock) else current
    counter = _Counter(current())
    loop._selector = _AutojumpSelector(selector, counter, autojump_threshold)  # type: ignore[attr-defined]
    loop.time = counter.now  # type: ignore[method-assign]
    try:
        yield VirtualClock(counter.now, counter.jump)
    finally:
        loop._selector = selector  # type: ignore[attr-defined]
        # Timers scheduled in virtual time stay valid: the clock continues from where it got to.
        loop.time = _OffsetClock(real_time, counter.now() - real_time())  # type: ignore[method-assign]


_active_mock_clocks: weakref.WeakSet[Any] = weakref.WeakSet()


@contextlib.asynccontextmanager
async def _trio_virtual_time(autojump_threshold: float) -> AsyncIterator[VirtualClock]:
    import trio
    import trio.testing

    clock = trio.lowlevel.current_clock()
    if not isinstance(clock, trio.testing.MockClock):
        raise RuntimeError(
            "virtual_time() on trio needs the run to use trio.testing.MockClock "
            '(anyio backend options {"clock": trio.testing.MockClock(rate=1)})'
        )
    if clock in _active_mock_clocks:
        raise RuntimeError("virtual_time() is already active on this run")
    rate, threshold = clock.rate, clock.autojump_threshold
    clock.rate = 0.0
    clock.autojump_threshold = autojump_threshold
    _active_mock_clocks.add(clock)
    try:
        yield VirtualClock(clock.current_time, clock.jump)
    finally:
        _active_mock_clocks.discard(clock)
        clock.autojump_threshold = threshold
        clock.rate = rate


@contextlib.asynccontextmanager
async def virtual_time(*, autojump_threshold: float = 0.0) -> AsyncIterator[VirtualClock]:
    """Run the block on a virtual clock that jumps to the next timer whenever all tasks wait."""
    if not autojump_threshold >= 0:
        raise ValueError(f"autojump_threshold must be >= 0 seconds, got {autojump_threshold!r}")
    native = anyio.lowlevel.current_token().native_token
    if isinstance(native, asyncio.AbstractEventLoop):
        async with _asyncio_virtual_time(native, autojump_threshold) as clock:
            yield clock
    else:
        async with _trio_virtual_time(autojump_threshold) as clock:
            yield clock
