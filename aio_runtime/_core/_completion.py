"""Completions: one-shot results that a callback (or another thread) delivers to waiting tasks."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Generic, Protocol, TypeVar

import anyio

from ._loop import loop_hooks

__all__ = ["Completion", "ThreadsafeSetter", "Waitable", "loop_caller"]

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


class Waitable(Protocol[T_co]):
    """Anything with an awaitable ``wait()``: :class:`Completion`, ``anyio.Event``."""

    def wait(self) -> Awaitable[T_co]: ...


class Completion(Generic[T]):
    """A one-shot result, set once and awaited by one or more tasks.

    ``set_result``/``set_exception`` must be called on the event loop thread (libusb transfer
    callbacks run there). Another thread uses :meth:`threadsafe_setter`, obtained on the loop
    beforehand. Completing twice is an error: a completion represents one event.
    """

    __slots__ = ("_event", "_exception", "_result", "_set")

    _result: T  # set by set_result; read only once set

    def __init__(self) -> None:
        self._event: anyio.Event | None = None  # made when a task first waits: most never do
        self._set = False
        self._exception: BaseException | None = None

    def done(self) -> bool:
        return self._set

    def set_result(self, value: T) -> None:
        self._finish()
        self._result = value
        if self._event is not None:
            self._event.set()

    def set_exception(self, exc: BaseException) -> None:
        self._finish()
        self._exception = exc
        if self._event is not None:
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
        return self._result

    async def wait(self) -> T:
        if not self._set:  # a result that is already there is returned without a loop pass
            if self._event is None:
                self._event = anyio.Event()
            await self._event.wait()
        return self.result()

    def threadsafe_setter(self) -> ThreadsafeSetter[T]:
        """Call on the loop; the returned object completes this completion from any thread."""
        return ThreadsafeSetter(self)


def loop_caller() -> Callable[[Callable[[], object]], None]:
    """Call on the loop; returns ``call(fn)`` that runs ``fn()`` soon on this loop, from any
    thread (dropped once the loop has closed: nobody is waiting any more)."""
    wake, _ = loop_hooks()

    def call(fn: Callable[[], object]) -> None:
        try:
            wake(fn)
        except RuntimeError:
            pass

    return call


class ThreadsafeSetter(Generic[T]):
    """Completes a :class:`Completion` from another thread by handing the call to the loop.

    The first completion wins; later ones are ignored.
    """

    def __init__(self, completion: Completion[T]) -> None:
        self._completion = completion
        self._deliver = loop_caller()

    def set_result(self, value: T) -> None:
        self._deliver(functools.partial(self._set_result, value))

    def set_exception(self, exc: BaseException) -> None:
        self._deliver(functools.partial(self._set_exception, exc))

    # On the loop thread. A second completion is dropped here rather than raised: raising inside a
    # loop callback would crash a trio run.
    def _set_result(self, value: T) -> None:
        if not self._completion.done():
            self._completion.set_result(value)

    def _set_exception(self, exc: BaseException) -> None:
        if not self._completion.done():
            self._completion.set_exception(exc)
