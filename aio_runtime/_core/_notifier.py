"""Wake-ups for a value that only its owner writes, so that a wait on it sleeps instead of polling.

A word a device writes with a plain store announces nothing: a wait has to read it again and
again. A value the host writes itself — a timeline signal's own slot, stored by ``set`` — can say
when it changed. A :class:`Notifier` carries that news: the writer stores the value, then calls
:meth:`Notifier.notify`; a wait given the notifier (``wait_until(..., notifier=...)``) reads the
value, and while the value does not satisfy it, sleeps until the next notification or its bound.
Its cost no longer grows with its timeout: it reads once at the start, once per notification and
once at its bound.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import anyio

from ._completion import loop_caller

__all__ = ["Notifier"]


class Notifier:
    """Announces the changes of a value that only its owner writes.

    The writer stores the new value first, then calls :meth:`notify`, from any thread: a wait on
    an event loop on another thread is woken through that loop's thread-safe call. A value that
    anything else may write (a device's plain store) must not be waited on with a notifier: such a
    store wakes nobody.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._listeners: set[Listener] = set()

    def notify(self) -> None:
        """The value changed: every wait on it reads it again."""
        with self._lock:
            listeners = list(self._listeners)
        for listener in listeners:
            listener.wake()

    def listen(self) -> Listener:
        """A subscription for one wait, taken on its event loop; close it when the wait ends."""
        listener = Listener(self)
        with self._lock:
            self._listeners.add(listener)
        return listener

    def forget(self, listener: Listener) -> None:
        with self._lock:
            self._listeners.discard(listener)


class Listener:
    """One wait's subscription to a :class:`Notifier`: :meth:`arm` before each read of the value,
    then :meth:`wait` returns once a change has been announced since (at once if one was)."""

    __slots__ = ("_call", "_event", "_notifier", "_thread")

    def __init__(self, notifier: Notifier) -> None:
        self._notifier = notifier
        self._thread = threading.get_ident()
        self._call: Callable[[Callable[[], object]], None] = loop_caller()
        self._event = anyio.Event()

    def arm(self) -> None:
        # A notification from here on ends the next wait. One that came before the read is
        # forgotten: the read sees its value, since the writer stores before it notifies.
        if self._event.is_set():
            self._event = anyio.Event()

    def wake(self) -> None:
        event = self._event
        if threading.get_ident() == self._thread:
            event.set()
        else:
            self._call(event.set)

    async def wait(self) -> None:
        await self._event.wait()

    def close(self) -> None:
        self._notifier.forget(self)
