"""Off-loop probing of memory words: one watcher thread per memory domain.

A device writes a completion value into memory with a plain store; nothing wakes the host. Probing
that word from the event loop costs at least a millisecond per read once the loop sleeps (asyncio
rounds its timers to milliseconds). A :class:`MemoryWatcher` instead probes every pending watch of one
memory domain (one device's signal page, say) from a single thread and hands a satisfied watch
back to its task with the loop's thread-safe call (asyncio's ``call_soon_threadsafe``, trio's
``run_sync_soon``).

The polling policy is a short spin, then backoff. For ``spin`` seconds after a watch starts, the
thread re-reads continuously, yielding the CPU and the GIL between sweeps (``os.sched_yield``), so a
completion that comes soon — a copy chunk, a fence, a mailbox answer — wakes its task within tens of
microseconds. After it, the thread sleeps between sweeps, a sixteenth of the time the youngest
watch has waited so far, from ``first_interval`` up to ``max_interval``: a wait pending for a whole
second costs a few percent of a core, and a late completion is seen at most ``max_interval`` late.
With no pending watch the thread blocks on a condition variable and costs nothing.

The spin is a trade: it spends up to ``spin`` seconds of one core per wait (yielded to any thread
that wants it) to buy latency. Give a watcher for long jobs (a model run of several milliseconds)
``spin=0``. The spin yields with ``sched_yield``, not ``time.sleep(0)``: see :func:`_yield_thread`.

Use it through :func:`aio_runtime.wait_until` (``watcher=...``) or a
:class:`~aio_runtime.TimelineSignal` built with one; both remove the watch when the wait
ends for any reason, and once a watch is removed its probe is never called again (sweeps run under
the watcher's lock), so the memory behind it may be released. A probe or predicate that raises
fails its own waiter only; if the thread itself stops, every pending waiter fails with
:class:`WatcherStopped` and the next watch starts a new thread.

A probe must be a plain read of memory that cannot block: sweeps hold the watcher's lock, and the
event loop takes that lock briefly to add and remove watches, so a stalled probe would stall the
loop too. A read that can stall (a register over a bus that may hang) is an async read on the loop.

Virtual time does not reach this thread: under a virtual clock, probe on the loop (the default).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import inspect
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import anyio

from ._bounds import WaitBound
from ._clock import now
from ._completion import Completion, loop_caller
from ._log import get_logger
from ._loop import loop_clock
from ._policy import differs

__all__ = ["MemoryWatcher", "Watch", "WatcherStatistics", "WatcherStopped"]

T = TypeVar("T")

_PR_SET_TIMERSLACK = 29

_log = get_logger("aio_runtime.watcher")


class WatcherStopped(RuntimeError):
    """The watcher was closed, or its thread stopped, while a wait was pending on it."""


def _tighten_timer_slack() -> None:
    """Ask Linux for 1 µs timer slack on this thread (default 50 µs) so short sleeps are short."""
    if not sys.platform.startswith("linux"):
        return
    libc_name = ctypes.util.find_library("c")
    if libc_name is None:
        return
    try:
        ctypes.CDLL(libc_name, use_errno=True).prctl(_PR_SET_TIMERSLACK, 1000, 0, 0, 0)
    except (OSError, AttributeError):
        return


def _yield_thread() -> None:
    """Let other threads run — the GIL and the CPU — between spinning sweeps.

    ``os.sched_yield`` rather than ``time.sleep(0)``: while a thread spun on ``sleep(0)``, the event
    loop's timers fired late by about the length of the spin (2.2 ms late after a 2 ms spin); with
    ``sched_yield`` they fire 0.3-0.5 ms late, as on an idle loop.
    """
    if hasattr(os, "sched_yield"):
        os.sched_yield()
    else:
        time.sleep(0)


class Watch(Generic[T]):
    """One pending wait on a watcher. Created by :meth:`MemoryWatcher.watch` on the loop thread.

    The watcher thread reports to it — :meth:`finish`, :meth:`fail`, :meth:`progressed` — and each
    report is handed to the loop thread-safely; the first outcome wins.
    """

    def __init__(
        self,
        probe: Callable[[], T],
        predicate: Callable[[T], bool],
        *,
        track_progress: bool,
        remove: Callable[[Watch[T]], None],
    ) -> None:
        self.probe = probe
        self.predicate = predicate
        self.track_progress = track_progress
        self._remove = remove
        self._completion: Completion[T] = Completion()
        self._outcome = self._completion.threadsafe_setter()
        self._progress = _ProgressNote() if track_progress else None
        self.started = time.monotonic()
        self.last_value: object = None

    @property
    def last_change(self) -> float | None:
        """Loop time at which the watcher last saw the value change (only with track_progress)."""
        return None if self._progress is None else self._progress.at

    async def wait(self) -> T:
        return await self._completion.wait()

    def cancel(self) -> None:
        """Stop watching. Once this returns the probe is not called again. Idempotent."""
        self._remove(self)

    # Called on the watcher thread.
    def finish(self, value: T) -> None:
        """The condition holds with ``value``: the wait returns it."""
        self._outcome.set_result(value)

    def fail(self, exc: BaseException) -> None:
        """The wait fails with ``exc`` (a probe that raised, a watcher that stopped)."""
        self._outcome.set_exception(exc)

    def progressed(self) -> None:
        """The value changed: :attr:`last_change` becomes the loop time the loop hears of it."""
        if self._progress is not None:
            self._progress.note()


class _ProgressNote:
    """When a watched value last changed, in loop time: noted on the loop, told from any thread."""

    def __init__(self) -> None:
        self._call = loop_caller()
        self._clock = loop_clock()
        self.at: float | None = None

    def note(self) -> None:
        self._call(self._noted)

    def _noted(self) -> None:  # on the loop thread
        self.at = self._clock()


@dataclass(frozen=True)
class WatcherStatistics:
    pending: int
    completed: int
    sweeps: int
    running: bool


class MemoryWatcher:
    """Probes the pending watches of one memory domain from one thread.

    ``spin``, ``first_interval`` and ``max_interval`` (seconds) set the polling policy described in
    the module documentation. The thread starts on the first watch and stops on :meth:`close` (or
    leaving the ``with`` block).
    """

    def __init__(
        self,
        name: str,
        *,
        spin: float = 0.003,
        first_interval: float = 50e-6,
        max_interval: float = 0.0005,
    ) -> None:
        if not 0 <= spin < 1.0:
            raise ValueError(f"spin must be in [0, 1) seconds, got {spin!r}")
        if not 0 < first_interval <= max_interval < 1.0:
            raise ValueError(
                "need 0 < first_interval <= max_interval < 1 second, "
                f"got {first_interval!r} and {max_interval!r}"
            )
        self.name = name
        self.spin = spin
        self.first_interval = first_interval
        self.max_interval = max_interval
        self._cond = threading.Condition()
        self._watches: dict[int, Watch[Any]] = {}
        self._thread: threading.Thread | None = None
        self._closed = False
        self._completed = 0
        self._sweeps = 0

    def __enter__(self) -> MemoryWatcher:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def watch(
        self,
        probe: Callable[[], T],
        predicate: Callable[[T], bool],
        *,
        track_progress: bool = False,
    ) -> Watch[T]:
        """Start watching; must be called from a task on the event loop that will await it."""
        watch = Watch(probe, predicate, track_progress=track_progress, remove=self._discard)
        with self._cond:
            if self._closed:
                raise WatcherStopped(f"memory watcher {self.name!r} is closed")
            self._watches[id(watch)] = watch
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name=f"memory-watcher-{self.name}", daemon=True
                )
                self._thread.start()
            self._cond.notify()
        return watch

    def statistics(self) -> WatcherStatistics:
        with self._cond:
            return WatcherStatistics(
                pending=len(self._watches),
                completed=self._completed,
                sweeps=self._sweeps,
                running=self._thread is not None and self._thread.is_alive(),
            )

    def close(self) -> None:
        """Stop the thread; pending waits fail at once with :class:`WatcherStopped`.

        Returns once the thread has finished its current sweep and pause (at most
        ``max_interval``), or after one second at the most.
        """
        with self._cond:
            self._closed = True
            self._cond.notify()
            thread = self._thread
        self._stopped(WatcherStopped(f"memory watcher {self.name!r} was closed"))
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=1.0)

    def _discard(self, watch: Watch[Any]) -> None:
        with self._cond:
            self._watches.pop(id(watch), None)

    def _run(self) -> None:
        _tighten_timer_slack()
        try:
            while True:
                with self._cond:
                    while not self._watches and not self._closed:
                        self._cond.wait()
                    if self._closed:
                        return
                    self._sweeps += 1
                    pending = list(self._watches.values())
                    for watch in pending:
                        self._sweep_one(watch)
                youngest = time.monotonic() - max(watch.started for watch in pending)
                pause = self._pause(youngest)
                if pause:
                    time.sleep(pause)
                else:
                    _yield_thread()
        except BaseException as exc:  # nothing may escape unseen: fail the waiters, log, end
            _log.error("memory watcher thread stopped", watcher=self.name, exc_info=exc)
            self._stopped(WatcherStopped(f"memory watcher {self.name!r} stopped: {exc!r}"))

    def _stopped(self, reason: WatcherStopped) -> None:
        """Fail every pending watch; the next :meth:`watch` starts a new thread."""
        with self._cond:
            pending = list(self._watches.values())
            self._watches.clear()
            self._thread = None
        for watch in pending:
            watch.fail(reason)

    def _pause(self, waited: float) -> float:
        """Sleep between sweeps once the youngest watch has waited ``waited`` seconds."""
        if waited < self.spin:
            return 0.0  # spin: yield between sweeps
        return min(self.max_interval, max(self.first_interval, (waited - self.spin) / 16))

    def _sweep_one(self, watch: Watch[Any]) -> None:
        """Probe one watch; called with the lock held."""
        try:
            value = watch.probe()
            satisfied = bool(watch.predicate(value))
        except Exception as exc:  # a broken probe fails its waiter instead of the watcher
            self._take(watch)
            watch.fail(exc)
            return
        if satisfied:
            self._take(watch)
            watch.finish(value)
            return
        if differs(value, watch.last_value):
            changed = watch.last_value is not None
            watch.last_value = value
            if changed and watch.track_progress:
                watch.progressed()

    def _take(self, watch: Watch[Any]) -> None:
        """A watch is answered: no further sweep probes it."""
        del self._watches[id(watch)]
        self._completed += 1


async def wait_watched(
    watcher: MemoryWatcher,
    probe: Callable[[], Any],
    predicate: Callable[[Any], bool],
    bound: WaitBound,
    awaited: str,
    expected: object,
    reset_on_progress: bool,
) -> Any:
    """``wait_until`` on a watcher: the probe read on the loop first, then by the watcher's
    thread until the predicate holds or the bound ends (a final read at the bound)."""
    value = probe()  # on the loop first: no thread hop when the condition already holds
    if inspect.isawaitable(value):
        if inspect.iscoroutine(value):
            value.close()
        raise TypeError("a MemoryWatcher probes plain memory reads, not async reads")
    if predicate(value):
        return bound.step_done(value)
    bound.note(awaited, expected, value)
    watch = watcher.watch(probe, predicate, track_progress=reset_on_progress)
    try:
        while True:
            with anyio.move_on_at(bound.at):
                return bound.step_done(await watch.wait())
            if reset_on_progress and watch.last_change is not None:
                bound.progress(watch.last_change)
                if now() < bound.at:
                    continue
            break
    finally:
        watch.cancel()
    value = probe()  # the final read at the bound
    if predicate(value):
        return bound.step_done(value)
    bound.note(awaited, expected, value)
    raise bound.timed_out()
