"""The one wait primitive: await a completion or a probed condition until a deadline.

Every wait in the project comes through here, so every wait has the same semantics:

* it is bounded — by its own ``timeout``, by the enclosing :func:`~aio_runtime.deadline_scope`, or
  by both (the earlier wins); with neither it is refused with
  :class:`~aio_runtime.UnboundedWaitError` before anything is awaited;
* it fails with a typed error: the wait's own ``error`` class (a
  :class:`~aio_runtime.HardwareTimeout` subclass) when its own timeout ran out, or
  :class:`~aio_runtime.BudgetExhausted` when the enclosing scope's budget did — each carrying
  the layer, what was awaited, the timeout, the elapsed time and expected/observed values;
* cancelling it (or timing out) removes the waiter: nothing stays registered.

Entry points, all built on one :class:`WaitBound` and bounded by the same keywords
(:class:`BoundArgs`: ``awaited``, and either ``error``/``timeout``/``layer`` or ``within`` — typed
as two overloads, :class:`OwnBound` and :class:`SharedBound`, so a type checker refuses a call
with neither):

* :func:`wait_complete` — for something a callback completes (a
  :class:`~aio_runtime.Completion`, an ``anyio.Event``). With ``cancel=``, an operation
  that is still in flight when the wait ends is asked to stop and its completion is awaited,
  shielded and bounded, before the wait returns (so its buffers are not reused under it).
* :func:`wait_until` — for a probe that must satisfy a predicate. A probe is a plain read (a memory
  word) or an async read (a register read that is itself a USB transfer). Probing follows a
  :class:`PollPolicy` (a short spin, then exponential backoff) on the event loop, or runs on a
  :class:`~aio_runtime.MemoryWatcher` thread when sub-millisecond detection matters. A value that
  only its owner writes and announces (a :class:`~aio_runtime.Notifier`) is not polled: the wait
  sleeps until the announcement.
* :class:`~aio_runtime.WaitBound` (its own module) — one bound over a sequence of steps (take a
  lock, write registers, poll a response): create it once, pass ``within=bound`` to the waits of
  the sequence and run its other steps with ``bound.run``, so the whole sequence shares one
  deadline and one error.
* :func:`drain` — what a wait with ``cancel=`` does when it ends early, for an operation nobody
  waits on (a transfer dropped unawaited): ask it to stop, then await its completion, shielded and
  bounded.
* :func:`pause` — a bounded sleep between attempts, the only sleep in the project.
"""

from __future__ import annotations

import contextlib
import contextvars
import inspect
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypedDict, TypeVar, Unpack, overload

import anyio
import anyio.lowlevel

from ._bounds import BoundArgs, OwnBound, SharedBound, resolve_bound
from ._clock import now, validate_timeout
from ._completion import Completion, Waitable
from ._errors import BudgetExhausted, HardwareTimeout
from ._notifier import Notifier
from ._policy import DEFAULT_POLICY, PollPolicy, differs
from ._watcher import wait_watched

if TYPE_CHECKING:
    from ._watcher import MemoryWatcher

__all__ = [
    "IMMEDIATE_BURST",
    "ProbeArgs",
    "completed_at_once",
    "drain",
    "pause",
    "wait_complete",
    "wait_until",
]

T = TypeVar("T")


class _NotObserved:
    def __repr__(self) -> str:
        return "nothing (never read)"


_NOT_OBSERVED: Any = _NotObserved()


IMMEDIATE_BURST = 4
"""Waits a task finds complete already, in a row, before it yields to the loop once."""

_at_once = contextvars.ContextVar("waits found complete in a row", default=0)
"""Per task: each task runs in a context of its own."""


async def completed_at_once() -> None:
    """Call where a wait finds its operation complete already and returns without suspending.
    Every :data:`IMMEDIATE_BURST`-th such wait in a row in one task yields to the loop once,
    shielded (the outcome is taken): a cooperative budget, as tokio's, so that a burst of
    operations that complete at once (a simulated device finishes a transfer inside its submit)
    does not hold the event loop for all of them in one step. A wait that suspends starts the
    count again."""
    taken = _at_once.get() + 1
    if taken >= IMMEDIATE_BURST:
        taken = 0
        await anyio.lowlevel.cancel_shielded_checkpoint()
    _at_once.set(taken)


def _already_done(completion: Waitable[Any]) -> bool:
    if isinstance(completion, Completion):
        return completion.done()
    if isinstance(completion, anyio.Event):
        return completion.is_set()
    return False


async def drain(
    completion: Waitable[object],
    cancel: Callable[[], object],
    *,
    limit: float,
    failure: BaseException | None = None,
) -> bool:
    """Ask an operation in flight to stop, then wait for its completion — shielded from
    cancellation, for at most ``limit`` seconds — so that its buffers may be reused or freed.

    Returns True once the operation has completed (at once, without asking it to stop, if it
    already had), False if it did not complete within ``limit``: its buffers still belong to it.
    What the stopped operation delivers (a result, or the error of a cancelled transfer) is
    dropped. A failing ``cancel()`` (cancelling a transfer that has just finished, a device that
    is gone) does not end the wait: it is noted on ``failure`` — the exception the caller is about
    to raise, if any — and otherwise ignored.
    """
    checked = validate_timeout(limit, what="limit")
    assert checked is not None
    if _already_done(completion):
        return True
    try:
        cancel()
    except Exception as cancel_error:
        if failure is not None:
            failure.add_note(f"asking the operation to stop failed: {cancel_error!r}")
    with anyio.CancelScope(shield=True), anyio.move_on_after(checked) as scope:
        with contextlib.suppress(Exception):  # the stopped operation's own outcome
            await completion.wait()
    return not scope.cancelled_caught


def _mark_in_flight(exc: BaseException, limit: float) -> None:
    if isinstance(exc, (HardwareTimeout, BudgetExhausted)):
        exc.in_flight = True
    exc.add_note(
        f"the operation did not stop within {limit:g} s of being asked to; "
        "its buffers still belong to it"
    )


@overload
async def wait_complete(
    completion: Waitable[T],
    *,
    cancel: Callable[[], object] | None = None,
    drain_timeout: float = 1.0,
    **bounding: Unpack[OwnBound],
) -> T: ...


@overload
async def wait_complete(
    completion: Waitable[T],
    *,
    cancel: Callable[[], object] | None = None,
    drain_timeout: float = 1.0,
    **bounding: Unpack[SharedBound],
) -> T: ...


async def wait_complete(
    completion: Waitable[T],
    *,
    cancel: Callable[[], object] | None = None,
    drain_timeout: float = 1.0,
    **bounding: Unpack[BoundArgs],
) -> T:
    """Wait for a callback to complete ``completion`` and return its result.

    Bounded by its :class:`BoundArgs`: ``awaited``, and either ``error`` (with ``timeout`` and
    ``layer``: :class:`OwnBound`) or ``within`` (:class:`SharedBound`). Raises ``error`` (its
    own timeout ran out) or :class:`BudgetExhausted` (the enclosing scope's did). An exception
    the completion carries is re-raised as is. A completion that is already done returns at
    once, even with no time left.

    ``cancel``: when the wait ends without the completion (timeout, budget or cancellation of the
    waiting task), call ``cancel()`` to ask the operation to stop (cancel a USB transfer, terminate
    an inference run), then await the completion — shielded, for at most ``drain_timeout`` — so the
    caller regains ownership of the operation's buffers. If it does not arrive, the error (the
    timeout, or the cancellation) says so in a note, and a timeout has ``in_flight = True``: the
    buffers still belong to the operation. A completion that landed as the deadline fell (in the same
    loop pass) stands: its result is returned, not discarded. What the operation delivers while it is
    being stopped only returns ownership of its buffers; the wait has timed out.
    """
    bound = resolve_bound("wait_complete", bounding)
    bound.note(bounding["awaited"])
    limit = validate_timeout(drain_timeout, what="drain_timeout")
    assert limit is not None
    if _already_done(completion):
        await completed_at_once()
        return bound.step_done(await completion.wait())
    _at_once.set(0)
    try:
        with anyio.CancelScope(deadline=bound.at):
            return bound.step_done(await completion.wait())
    except BaseException as exc:
        if cancel is not None and not await drain(completion, cancel, limit=limit, failure=exc):
            _mark_in_flight(exc, limit)
        raise
    if _already_done(completion):  # it completed as the deadline fell: that outcome stands
        return bound.step_done(await completion.wait())
    timed_out = bound.timed_out()
    if cancel is not None and not await drain(completion, cancel, limit=limit, failure=timed_out):
        _mark_in_flight(timed_out, limit)
    raise timed_out


class ProbeArgs(TypedDict, total=False):
    """How :func:`wait_until` reads its probe: the keywords it takes beside its bound."""

    expected: object
    policy: PollPolicy
    reset_on_progress: bool
    watcher: MemoryWatcher | None
    notifier: Notifier | None


class _OwnBoundProbe(OwnBound, ProbeArgs, total=False):
    pass


class _SharedBoundProbe(SharedBound, ProbeArgs, total=False):
    pass


@overload
async def wait_until(
    probe: Callable[[], Awaitable[T]],
    predicate: Callable[[T], bool],
    **options: Unpack[_OwnBoundProbe],
) -> T: ...


@overload
async def wait_until(
    probe: Callable[[], Awaitable[T]],
    predicate: Callable[[T], bool],
    **options: Unpack[_SharedBoundProbe],
) -> T: ...


@overload
async def wait_until(
    probe: Callable[[], T], predicate: Callable[[T], bool], **options: Unpack[_OwnBoundProbe]
) -> T: ...


@overload
async def wait_until(
    probe: Callable[[], T], predicate: Callable[[T], bool], **options: Unpack[_SharedBoundProbe]
) -> T: ...


async def wait_until(
    probe: Callable[[], Any],
    predicate: Callable[[Any], bool],
    *,
    expected: object = None,
    policy: PollPolicy = DEFAULT_POLICY,
    reset_on_progress: bool = False,
    watcher: MemoryWatcher | None = None,
    notifier: Notifier | None = None,
    **bounding: Unpack[BoundArgs],
) -> Any:
    """Read ``probe`` until ``predicate(value)`` holds; return that value.

    Bounded by its :class:`BoundArgs`: ``awaited``, and either ``error`` (with ``timeout`` and
    ``layer``: :class:`OwnBound`) or ``within`` (:class:`SharedBound`).
    ``probe`` is a plain read or returns an awaitable (an async register read). The probe is read
    at least once, so a condition that already holds returns even with no time left. The last value
    read is reported as ``observed`` on timeout, ``expected`` as given. A plain read is taken once
    more when the bound is reached, so a value that arrived exactly at the deadline counts (an
    async read is not: it would need time the bound no longer has).

    ``reset_on_progress=True`` turns the wait's own timeout into an inactivity timeout: the timer
    restarts whenever the observed value changes (tinygrad's signal semantics). An enclosing
    deadline scope is absolute and never moves.

    ``watcher``: probe on that watcher's thread instead of the loop (``probe`` must then be a plain
    read); the waiting task is woken thread-safely. ``notifier``: the value changes only when that
    :class:`~aio_runtime.Notifier` says so, so between reads the wait sleeps until it does (or
    until its bound) instead of following ``policy``.
    """
    return await probe_until(
        "wait_until",
        probe,
        predicate,
        bounding,
        expected=expected,
        policy=policy,
        reset_on_progress=reset_on_progress,
        watcher=watcher,
        notifier=notifier,
    )


async def probe_until(
    waiter: str,
    probe: Callable[[], Any],
    predicate: Callable[[Any], bool],
    bounding: BoundArgs,
    *,
    expected: object = None,
    policy: PollPolicy = DEFAULT_POLICY,
    reset_on_progress: bool = False,
    watcher: MemoryWatcher | None = None,
    notifier: Notifier | None = None,
) -> Any:
    """:func:`wait_until` for the core's own waits that pass their :class:`BoundArgs` on as they
    received them; ``waiter`` names the public function in errors about its keywords."""
    if reset_on_progress and bounding.get("within") is not None:
        raise TypeError("reset_on_progress restarts a wait's own timer; a shared bound has none")
    if watcher is not None and notifier is not None:
        raise TypeError("a value a notifier announces needs no watcher: pass one or the other")
    bound = resolve_bound(waiter, bounding)
    awaited = bounding["awaited"]
    bound.note(awaited, expected, _NOT_OBSERVED)
    if watcher is not None:
        return await wait_watched(
            watcher, probe, predicate, bound, awaited, expected, reset_on_progress
        )
    listener = None if notifier is None else notifier.listen()
    observed: Any = _NOT_OBSERVED
    probe_is_async = False
    intervals = policy.intervals()
    try:
        with anyio.CancelScope(deadline=bound.at) as scope:
            if policy.yield_first:  # shielded: the probe is still read once with no time left
                await anyio.lowlevel.cancel_shielded_checkpoint()
            while True:
                if listener is not None:
                    listener.arm()
                value = probe()
                if inspect.isawaitable(value):
                    probe_is_async = True
                    value = await value
                if predicate(value):
                    return bound.step_done(value)
                if reset_on_progress and observed is not _NOT_OBSERVED and differs(value, observed):
                    bound.progress(now())
                    scope.deadline = bound.at
                observed = value
                bound.note(awaited, expected, observed)
                t = now()
                if t >= bound.at:
                    break
                if listener is not None:
                    await listener.wait()
                    continue
                delay = next(intervals)
                if delay == 0.0:
                    await anyio.lowlevel.checkpoint()
                else:
                    await anyio.sleep(min(delay, bound.at - t))
    finally:
        if listener is not None:
            listener.close()
    if scope.cancelled_caught and not probe_is_async:
        value = probe()
        if predicate(value):
            return bound.step_done(value)
        bound.note(awaited, expected, value)
    raise bound.timed_out()


async def pause(seconds: float) -> None:
    """Sleep for a bounded time on the loop clock (used between attempts, never to poll)."""
    delay = validate_timeout(seconds, what="pause")
    assert delay is not None
    await anyio.sleep(delay)
