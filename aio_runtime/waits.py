"""The one wait primitive: await a completion or a probed condition until a deadline.

Every wait in the project comes through here, so every wait has the same semantics:

* it is bounded — by its own ``timeout``, by the enclosing :func:`~aio_runtime.deadline_scope`, or
  by both (the earlier wins); with neither it is refused with
  :class:`~aio_runtime.errors.UnboundedWaitError` before anything is awaited;
* it fails with a typed error: the wait's own ``error`` class (a
  :class:`~aio_runtime.errors.HardwareTimeout` subclass) when its own timeout ran out, or
  :class:`~aio_runtime.errors.BudgetExhausted` when the enclosing scope's budget did — each carrying
  the layer, what was awaited, the timeout, the elapsed time and expected/observed values;
* cancelling it (or timing out) removes the waiter: nothing stays registered.

Entry points:

* :func:`wait_complete` — for something a callback completes (a :class:`Completion`, an
  ``anyio.Event``, anything with an awaitable ``wait()``).
* :func:`wait_until` — for a probe that must satisfy a predicate. A probe is a plain read
  (a memory word) or an async read (a register read that is itself a USB transfer). Probing follows a
  :class:`PollPolicy` (a short spin, then exponential backoff) on the event loop, or runs on a
  :class:`~aio_runtime.watcher.MemoryWatcher` thread when sub-millisecond detection matters.
* :func:`pause` — a bounded sleep (backoff between attempts), the only sleep in the project.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar, overload

import anyio
import anyio.lowlevel

from .clock import Deadline, current_deadline, now, validate_timeout
from .errors import BudgetExhausted, HardwareTimeout, Layer, UnboundedWaitError

if TYPE_CHECKING:
    from .watcher import MemoryWatcher, Watch

__all__ = [
    "DEFAULT_POLICY",
    "Completion",
    "PollPolicy",
    "Waitable",
    "pause",
    "wait_complete",
    "wait_until",
]

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


class Waitable(Protocol[T_co]):
    """Anything with an awaitable ``wait()``: :class:`Completion`, ``anyio.Event``."""

    def wait(self) -> Awaitable[T_co]: ...


class Completion(Generic[T]):
    """A one-shot result set by a callback on the event loop thread and awaited by one or more tasks.

    ``set_result``/``set_exception`` must be called on the loop thread (libusb transfer callbacks
    run there). Code on another thread hands the call to the loop first (see
    :class:`~aio_runtime.watcher.MemoryWatcher`). Completing twice is an error: a completion
    represents one event.
    """

    __slots__ = ("_event", "_exception", "_result", "_set")

    def __init__(self) -> None:
        self._event = anyio.Event()
        self._set = False
        self._result: T | None = None
        self._exception: BaseException | None = None

    def done(self) -> bool:
        return self._set

    def set_result(self, value: T) -> None:
        self._finish()
        self._result = value
        self._event.set()

    def set_exception(self, exc: BaseException) -> None:
        self._finish()
        self._exception = exc
        self._event.set()

    def _finish(self) -> None:
        if self._set:
            raise RuntimeError("completion already set")
        self._set = True

    def result(self) -> T:
        """The result, or the exception raised; :class:`RuntimeError` if not done yet."""
        if not self._set:
            raise RuntimeError("completion not done yet")
        if self._exception is not None:
            raise self._exception
        return self._result  # type: ignore[return-value]

    async def wait(self) -> T:
        await self._event.wait()
        return self.result()


@dataclass(frozen=True)
class PollPolicy:
    """How a probe is repeated on the event loop.

    First ``spin`` immediate re-reads (each yields to the loop once, so other tasks still run), then
    sleeps starting at ``first_interval`` and growing by ``factor`` up to ``max_interval``. Spins are
    counted, not timed, so a spin cannot run forever under a virtual clock. asyncio's selector
    rounds sleeps up to whole milliseconds; for sub-millisecond detection of a memory word use a
    :class:`~aio_runtime.watcher.MemoryWatcher` instead.
    """

    spin: int = 4
    first_interval: float = 0.0002
    max_interval: float = 0.005
    factor: float = 2.0

    def __post_init__(self) -> None:
        if self.spin < 0:
            raise ValueError(f"spin must be >= 0, got {self.spin}")
        for name in ("first_interval", "max_interval"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite number of seconds > 0, got {value!r}")
        if self.max_interval < self.first_interval:
            raise ValueError("max_interval must be >= first_interval")
        if not (math.isfinite(self.factor) and self.factor >= 1.0):
            raise ValueError(f"factor must be >= 1, got {self.factor!r}")

    def intervals(self) -> Iterator[float]:
        """Delays between successive reads: ``spin`` zeros, then the backoff sequence."""
        for _ in range(self.spin):
            yield 0.0
        interval = self.first_interval
        while True:
            yield interval
            interval = min(self.max_interval, interval * self.factor)


DEFAULT_POLICY = PollPolicy()


class _NotObserved:
    def __repr__(self) -> str:
        return "nothing (never read)"


_NOT_OBSERVED = _NotObserved()


@dataclass
class _Bound:
    """The resolved bound of one wait: its own timeout and the enclosing scope, whichever is first."""

    started: float
    timeout: float | None
    scope: Deadline | None
    own_at: float

    @classmethod
    def resolve(cls, timeout: float | None, awaited: str) -> _Bound:
        own = validate_timeout(timeout)
        scope = current_deadline()
        if own is None and scope is None:
            raise UnboundedWaitError(
                f"refusing to wait for {awaited} without a bound: pass timeout=<seconds> or run "
                "inside aio_runtime.deadline_scope() (a caller's own anyio/asyncio timeout is not "
                "a bound the runtime can report as a typed hardware timeout)"
            )
        started = now()
        return cls(started, own, scope, math.inf if own is None else started + own)

    @property
    def at(self) -> float:
        scope_at = math.inf if self.scope is None else self.scope.at
        return min(self.own_at, scope_at)

    def progress(self, when: float) -> None:
        """Restart the wait's own timer (inactivity timeouts); the scope never moves."""
        if self.timeout is not None:
            self.own_at = when + self.timeout

    def error(
        self,
        *,
        awaited: str,
        error: type[HardwareTimeout],
        layer: Layer | None,
        expected: object,
        observed: object,
    ) -> HardwareTimeout | BudgetExhausted:
        t = now()
        layer = layer if layer is not None else error.default_layer
        if self.scope is not None and self.scope.at <= self.own_at:
            return BudgetExhausted(
                budget=self.scope.name,
                awaited=awaited,
                timeout=self.scope.budget,
                elapsed=t - self.scope.started,
                layer=layer,
                expected=expected,
                observed=observed,
            )
        assert self.timeout is not None
        return error(
            awaited=awaited,
            timeout=self.timeout,
            elapsed=t - self.started,
            layer=layer,
            expected=expected,
            observed=observed,
        )


async def wait_complete(
    completion: Waitable[T],
    *,
    awaited: str,
    error: type[HardwareTimeout],
    timeout: float | None = None,
    layer: Layer | None = None,
) -> T:
    """Wait for a callback to complete ``completion`` and return its result.

    Raises ``error`` (its own timeout ran out) or :class:`BudgetExhausted` (the enclosing scope's
    did). An exception the completion carries is re-raised as is.
    """
    bound = _Bound.resolve(timeout, awaited)
    with anyio.move_on_at(bound.at):
        return await completion.wait()
    raise bound.error(awaited=awaited, error=error, layer=layer, expected=None, observed=None)


@overload
async def wait_until(
    probe: Callable[[], Awaitable[T]],
    predicate: Callable[[T], bool],
    *,
    awaited: str,
    error: type[HardwareTimeout],
    timeout: float | None = None,
    layer: Layer | None = None,
    expected: object = None,
    policy: PollPolicy = DEFAULT_POLICY,
    reset_on_progress: bool = False,
    watcher: MemoryWatcher | None = None,
) -> T: ...


@overload
async def wait_until(
    probe: Callable[[], T],
    predicate: Callable[[T], bool],
    *,
    awaited: str,
    error: type[HardwareTimeout],
    timeout: float | None = None,
    layer: Layer | None = None,
    expected: object = None,
    policy: PollPolicy = DEFAULT_POLICY,
    reset_on_progress: bool = False,
    watcher: MemoryWatcher | None = None,
) -> T: ...


async def wait_until(
    probe: Callable[[], Any],
    predicate: Callable[[Any], bool],
    *,
    awaited: str,
    error: type[HardwareTimeout],
    timeout: float | None = None,
    layer: Layer | None = None,
    expected: object = None,
    policy: PollPolicy = DEFAULT_POLICY,
    reset_on_progress: bool = False,
    watcher: MemoryWatcher | None = None,
) -> Any:
    """Read ``probe`` until ``predicate(value)`` holds; return that value.

    ``probe`` is a plain read or returns an awaitable (an async register read). The last value read
    is reported as ``observed`` on timeout, ``expected`` as given. When the bound is reached the
    probe is read once more before giving up, so a value that arrived exactly at the deadline counts.

    ``reset_on_progress=True`` turns the wait's own timeout into an inactivity timeout: the timer
    restarts whenever the observed value changes (tinygrad's signal semantics). An enclosing
    deadline scope is absolute and never moves.

    ``watcher``: probe on that watcher's thread instead of the loop (``probe`` must then be a plain
    read); the waiting task is woken thread-safely, within the watcher's polling interval.
    """
    bound = _Bound.resolve(timeout, awaited)
    if watcher is not None:
        return await _wait_watched(
            watcher, probe, predicate, bound, awaited, error, layer, expected, reset_on_progress
        )
    observed: object = _NOT_OBSERVED
    probe_is_async = False
    intervals = policy.intervals()
    with anyio.CancelScope(deadline=bound.at) as scope:
        while True:
            value = probe()
            if inspect.isawaitable(value):
                probe_is_async = True
                value = await value
            if predicate(value):
                return value
            if reset_on_progress and observed is not _NOT_OBSERVED and value != observed:
                bound.progress(now())
                scope.deadline = bound.at
            observed = value
            t = now()
            if t >= bound.at:
                break
            delay = next(intervals)
            if delay == 0.0:
                await anyio.lowlevel.checkpoint()
            else:
                await anyio.sleep(min(delay, bound.at - t))
    if scope.cancelled_caught and not probe_is_async:
        # The bound cancelled a sleep between reads: one last read, as the docstring promises.
        value = probe()
        if predicate(value):
            return value
        observed = value
    raise bound.error(
        awaited=awaited, error=error, layer=layer, expected=expected, observed=observed
    )


async def _wait_watched(
    watcher: MemoryWatcher,
    probe: Callable[[], Any],
    predicate: Callable[[Any], bool],
    bound: _Bound,
    awaited: str,
    error: type[HardwareTimeout],
    layer: Layer | None,
    expected: object,
    reset_on_progress: bool,
) -> Any:
    if inspect.iscoroutinefunction(probe):
        raise TypeError("a MemoryWatcher probes plain memory reads, not async reads")
    watch: Watch[Any] = watcher.watch(probe, predicate, track_progress=reset_on_progress)
    try:
        while True:
            with anyio.move_on_at(bound.at):
                return await watch.wait()
            if reset_on_progress and watch.last_change is not None:
                bound.progress(watch.last_change)
                if now() < bound.at:
                    continue
            break
    finally:
        watch.cancel()
    raise bound.error(
        awaited=awaited, error=error, layer=layer, expected=expected, observed=watch.last_value
    )


async def pause(seconds: float) -> None:
    """Sleep for a bounded time on the loop clock (used between attempts, never to poll)."""
    delay = validate_timeout(seconds, what="pause")
    assert delay is not None
    await anyio.sleep(delay)
