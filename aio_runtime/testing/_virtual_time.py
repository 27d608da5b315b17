"""Virtual time for tests: a 30 s hardware timeout in milliseconds.

Inside ``async with virtual_time():`` the running event loop's clock stops following the wall clock.
Whenever every task is blocked and the loop would sleep until its next timer, the clock jumps to
that timer instead. Timeouts therefore fire in the order and at the instants they would in real time,
deterministically, without waiting.

This is safe when everything that can wake a task lives on the event loop: timers, tasks, and
simulated hardware driven by them. Work on other threads (worker threads, a
:class:`~aio_runtime.MemoryWatcher`) does not hold the clock back: by the time a thread
finishes, a deadline may have been jumped past. ``autojump_threshold`` (real seconds) makes the loop
wait that long for I/O or a thread before jumping, as trio's ``MockClock`` does — on asyncio at most
until the next timer, which then fires when it would in real time (timers shorter than the threshold
run at real-time speed).

``hold`` (asyncio) makes work on threads take no virtual time, whatever its real duration: while
``hold()`` is true the clock does not jump, and the loop waits for I/O or a thread's wake-up instead.
:func:`threads_busy` is the usual ``hold``: true while the loop awaits a call made with
:func:`aio_runtime.run_in_thread` or ``anyio.to_thread.run_sync``. A hold that lasts ``hold_limit``
real seconds without the loop being woken gives way until it ends (a call that never returns still
meets its timeout). Code that does its work on threads — the DMS service: its warp, its model, its
start-up — runs under ``virtual_time(autojump_threshold=0.005, hold=threads_busy())``.

Without a hold, a timeout that ends the block after the clock jumped while such a call was in
flight carries a note saying so and naming that recipe: the call's bound ran out in virtual time
while the thread was still working.

asyncio: the running selector event loop is switched in place (its clock and its selector are
wrapped), and switched back on exit with its clock kept monotonic. trio: the run must use
``trio.testing.MockClock`` (``anyio`` backend options ``{"clock": MockClock(rate=1)}``); the block sets
its rate to 0 and its autojump threshold, and restores both on exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import selectors
import weakref
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio.lowlevel
import anyio.to_thread

from .._core._ownership import Ledger, LedgerKind, current_ledger

__all__ = ["VirtualClock", "threads_busy", "virtual_time"]


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
    """Wraps a selector: when the loop would sleep ``timeout`` with no I/O ready, jump instead.

    Whatever it returns, the clock has reached every timer the loop is about to run. asyncio runs
    a timer up to its clock resolution before the timer's time, which is harmless on a clock that
    keeps moving; on a clock that moves only when the loop is idle it is not. A wait that re-reads
    the clock and sleeps what is left of its deadline (anyio's cancel scopes, a polling probe) would
    see that deadline a rounding error ahead, run again at once, and — with two such waits taking
    turns, the loop never idle — see it ahead forever.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        inner: selectors.BaseSelector,
        counter: _Counter,
        autojump_threshold: float,
        hold: Callable[[], bool] | None = None,
        hold_limit: float = 0.0,
        threads: Callable[[], bool] | None = None,
    ) -> None:
        self._loop = loop
        self._inner = inner
        self._counter = counter
        self._threshold = autojump_threshold
        self._hold = hold
        self._hold_limit = hold_limit
        self._gave_way = False
        self._threads = threads
        self.jumped_past_a_thread: float | None = None
        """Seconds of the first jump made, unheld, while work ran on a thread (None: none was)."""

    def _held(self) -> list[tuple[selectors.SelectorKey, int]] | None:
        """While ``hold()`` is true, wait for a wake-up instead of jumping: its events, or None
        when nothing holds the clock (or the hold gave way after ``hold_limit``)."""
        if self._hold is None:
            return None
        if not self._hold():
            self._gave_way = False
            return None
        if self._gave_way:
            return None
        events = self._inner.select(self._hold_limit)
        if not events:
            self._gave_way = True  # nothing woke the loop: do not wait for this hold again
            return None
        return events

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        events = self._select(timeout)
        self._reach_due_timers()
        return events

    def _select(self, timeout: float | None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is None:
            # No timer pending: only I/O or another thread can wake the loop. Block for it.
            return self._inner.select(None)
        if timeout > 0:
            held = self._held()
            if held is not None:
                return held
        events = self._inner.select(0 if timeout <= 0 else min(self._threshold, timeout))
        if events or timeout <= 0:
            return events
        if self.jumped_past_a_thread is None and self._threads is not None and self._threads():
            self.jumped_past_a_thread = timeout
        self._counter.jump(timeout)
        return []

    def _reach_due_timers(self) -> None:
        """Move the clock to the latest timer the loop will run on this pass: those due within
        its clock resolution. The timers are a heap, so only those and their children are read."""
        scheduled: list[asyncio.TimerHandle] = self._loop._scheduled  # type: ignore[attr-defined]
        resolution: float = self._loop._clock_resolution  # type: ignore[attr-defined]
        counter = self._counter
        while True:
            end, latest, pending = counter.value + resolution, counter.value, [0]
            while pending:
                index = pending.pop()
                if index < len(scheduled) and scheduled[index].when() <= end:
                    if not scheduled[index].cancelled():
                        latest = max(latest, _running(scheduled[index].when(), resolution))
                    pending += (2 * index + 1, 2 * index + 2)
            if latest <= counter.value:
                return
            counter.value = latest  # later timers may now be due within the resolution

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def _running(when: float, resolution: float) -> float:
    """The earliest reading of the clock at which asyncio runs a timer set for ``when``: it runs
    those set before its time plus its clock resolution, and far enough from zero (half a year of
    a monotonic clock) that sum rounds to the time itself."""
    return when if when + resolution > when else math.nextafter(when, math.inf)


class _OffsetClock:
    """The loop's own clock plus a fixed offset: what the loop reads after a virtual-time block."""

    def __init__(self, base: Callable[[], float], offset: float) -> None:
        self.base = base
        self.offset = offset

    def __call__(self) -> float:
        return self.base() + self.offset


@contextlib.asynccontextmanager
async def _asyncio_virtual_time(
    loop: asyncio.AbstractEventLoop,
    autojump_threshold: float,
    hold: Callable[[], bool] | None,
    hold_limit: float,
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
    threads = threads_busy() if hold is None else None
    autojump = _AutojumpSelector(
        loop, selector, counter, autojump_threshold, hold, hold_limit, threads
    )
    loop._selector = autojump  # type: ignore[attr-defined]
    loop.time = counter.now  # type: ignore[method-assign]
    try:
        yield VirtualClock(counter.now, counter.jump)
    except BaseException as exc:
        if autojump.jumped_past_a_thread is not None and _timed_out(exc):
            exc.add_note(_JUMPED_PAST_A_THREAD.format(seconds=autojump.jumped_past_a_thread))
        raise
    finally:
        loop._selector = selector  # type: ignore[attr-defined]
        # Timers scheduled in virtual time stay valid: the clock continues from where it got to.
        loop.time = _OffsetClock(real_time, counter.now() - real_time())  # type: ignore[method-assign]


_JUMPED_PAST_A_THREAD = (
    "virtual time jumped {seconds:.3f} s ahead while work ran on a thread (run_in_thread, "
    "anyio.to_thread): the clock of a plain virtual_time() does not wait for threads, so a bound "
    "can run out while the thread is still working. Hold the clock while threads work: "
    "virtual_time(autojump_threshold=0.005, hold=threads_busy())"
)


def _timed_out(error: BaseException) -> bool:
    """Whether ``error`` is a timeout, or was caused by one (its cause, its context, the errors
    of its group)."""
    seen: set[int] = set()
    pending = [error]
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, TimeoutError):
            return True
        if isinstance(current, BaseExceptionGroup):
            pending.extend(current.exceptions)
        pending.extend(e for e in (current.__cause__, current.__context__) if e is not None)
    return False


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
async def virtual_time(
    *,
    autojump_threshold: float = 0.0,
    hold: Callable[[], bool] | None = None,
    hold_limit: float = 10.0,
) -> AsyncIterator[VirtualClock]:
    """Run the block on a virtual clock that jumps to the next timer whenever all tasks wait.

    ``hold`` (asyncio only): while it returns true the clock does not jump; the loop waits for I/O
    or a wake-up from another thread instead, for at most ``hold_limit`` real seconds. Usually
    :func:`threads_busy`, so that work on threads takes no virtual time. Without one, a timeout
    raised out of the block after the clock jumped while work ran on a thread has a note that
    says so (asyncio)."""
    if not autojump_threshold >= 0:
        raise ValueError(f"autojump_threshold must be >= 0 seconds, got {autojump_threshold!r}")
    if not hold_limit > 0:
        raise ValueError(f"hold_limit must be > 0 seconds, got {hold_limit!r}")
    native = anyio.lowlevel.current_token().native_token
    if isinstance(native, asyncio.AbstractEventLoop):
        async with _asyncio_virtual_time(native, autojump_threshold, hold, hold_limit) as clock:
            yield clock
    else:
        if hold is not None:
            raise RuntimeError("virtual_time(hold=...) is supported on asyncio only")
        async with _trio_virtual_time(autojump_threshold) as clock:
            yield clock


def threads_busy(ledger: Ledger | None = None) -> Callable[[], bool]:
    """A ``hold`` for :func:`virtual_time`: true while the loop awaits work on a thread.

    That is a call made with :func:`aio_runtime.run_in_thread` (a live
    :attr:`~aio_runtime.LedgerKind.WORKER_THREAD` entry in ``ledger``, default the current one) or
    with ``anyio.to_thread.run_sync`` (a token of anyio's default thread limiter, given back on the
    loop once the result is in). Call it on the loop.

    ``run_in_thread`` closes its ledger entry just before the thread wakes the loop with the result:
    give ``virtual_time`` an ``autojump_threshold`` of a few milliseconds so that the loop, finding
    the entry closed, still sees that wake-up before it jumps.
    """
    recorded = current_ledger() if ledger is None else ledger
    limiter = anyio.to_thread.current_default_thread_limiter()

    def busy() -> bool:
        return limiter.borrowed_tokens > 0 or any(
            entry.kind == LedgerKind.WORKER_THREAD for entry in recorded.live()
        )

    return busy
