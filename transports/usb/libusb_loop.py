"""libusb's events handled by the asyncio event loop: no thread sits in libusb.

:class:`LibusbContext` (an async context manager) owns a libusb context and watches every file
descriptor libusb polls — its event and timer fds, and the usbfs fd of each open device, added and
removed through libusb's pollfd notifiers as devices open and close — with ``loop.add_reader`` /
``add_writer``. On readiness it runs ``handleEventsTimeout(0)`` (non-blocking), so transfer callbacks
run on the loop thread. An fd that epoll refuses (umockdev's emulated node is a regular file) is
polled instead on a loop timer every ``fallback_interval`` seconds, until libusb removes it.

asyncio only: trio has no callback-style fd watching (see :mod:`transports.usb.libusb_backend`).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import usb1  # type: ignore[import-untyped]

from aio_runtime import get_logger

__all__ = ["LibusbContext"]

_POLLIN, _POLLOUT = 0x001, 0x004
_log = get_logger(__name__)


class LibusbContext:
    """A libusb context whose events the running asyncio loop handles; see the module docstring.

    Open transports (:func:`~transports.usb.libusb_backend.open_bridge`) inside it and close them
    before it exits. ``fallback_interval``: how often an fd that epoll refuses is polled (asyncio
    rounds timer waits up to whole milliseconds, so at most about once a millisecond).
    """

    def __init__(self, *, fallback_interval: float = 0.0005) -> None:
        self.fallback_interval = fallback_interval
        self._usb: usb1.USBContext | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = 0
        self._watched: dict[int, int] = {}
        """fd -> the events it is watched for on the loop's selector."""
        self._polled: set[int] = set()
        """fds the selector refused: handled on the fallback timer."""
        self._timer: asyncio.TimerHandle | None = None
        self._lock = threading.Lock()
        self._pending: dict[int, int] = {}
        """fds libusb added on another thread, not yet watched by the loop."""
        self.fallback_polls = 0
        """How many times the fallback timer has handled events."""

    @property
    def usb(self) -> usb1.USBContext:
        if self._usb is None:
            raise RuntimeError("the libusb context is not open (use 'async with LibusbContext()')")
        return self._usb

    @property
    def watched_fds(self) -> frozenset[int]:
        """The fds the loop's selector watches."""
        return frozenset(self._watched)

    @property
    def polled_fds(self) -> frozenset[int]:
        """The fds polled on the fallback timer (epoll refused them)."""
        return frozenset(self._polled)

    async def __aenter__(self) -> LibusbContext:
        try:
            self._loop = asyncio.get_running_loop()
        except RuntimeError:
            raise RuntimeError(
                "the libusb backend runs on asyncio (on trio, use the pyusb backend)"
            ) from None
        self._thread = threading.get_ident()
        self._usb = usb1.USBContext()
        self._usb.open()
        self._usb.setPollFDNotifiers(self._on_added, self._on_removed)
        for fd, events in self._usb.getPollFDList():
            self._watch(fd, events)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        usb, self._usb = self._usb, None
        for fd in list(self._watched) + list(self._polled):
            self._unwatch(fd)
        if usb is not None:
            usb.setPollFDNotifiers(None, None)
            usb.close()

    # -- called on any thread ------------------------------------------------------------------

    def on_loop(self, fn: Callable[[], object]) -> None:
        """Run ``fn()`` on the loop thread: now if this is it, else soon (libusb runs a transfer's
        callback on whichever thread handles its events, e.g. one in a blocking libusb call)."""
        if threading.get_ident() == self._thread:
            fn()
        elif self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(fn)

    # libusb's pollfd notifiers. Devices are opened and closed on the loop thread, so these
    # normally run there; from another thread (libusb handling events in a blocking call) the
    # change is handed to the loop, and a removal waits (briefly) until the loop has let go of
    # the fd, because libusb closes it as soon as the notifier returns.

    def _on_added(self, fd: int, events: int, _user_data: object) -> None:
        if threading.get_ident() == self._thread:
            self._watch(fd, events)
            return
        with self._lock:
            self._pending[fd] = events
        self.on_loop(lambda: self._watch_pending(fd))

    def _on_removed(self, fd: int, _user_data: object) -> None:
        if threading.get_ident() == self._thread:
            self._unwatch(fd)
            return
        with self._lock:
            if self._pending.pop(fd, None) is not None:
                return  # the loop never started watching it
        if self._loop is None or self._loop.is_closed():
            return
        unwatched = threading.Event()

        def unwatch() -> None:
            self._unwatch(fd)
            unwatched.set()

        self.on_loop(unwatch)
        unwatched.wait(1.0)

    def _watch_pending(self, fd: int) -> None:
        with self._lock:  # held while watching: a removal on another thread waits for it
            events = self._pending.pop(fd, None)
            if events is not None:
                self._watch(fd, events)

    # -- on the loop thread --------------------------------------------------------------------

    def _watch(self, fd: int, events: int) -> None:
        loop = self._loop
        if loop is None or self._usb is None:
            return
        self._unwatch(fd)
        try:
            if events & _POLLIN:
                loop.add_reader(fd, self._handle_events)
            if events & _POLLOUT:
                loop.add_writer(fd, self._handle_events)
        except PermissionError:  # epoll refuses regular files: umockdev's emulated node
            loop.remove_reader(fd)
            self._polled.add(fd)
            if self._timer is None:
                self._timer = loop.call_later(self.fallback_interval, self._poll)
            return
        self._watched[fd] = events

    def _unwatch(self, fd: int) -> None:
        events = self._watched.pop(fd, 0)
        if self._loop is not None:
            if events & _POLLIN:
                self._loop.remove_reader(fd)
            if events & _POLLOUT:
                self._loop.remove_writer(fd)
        self._polled.discard(fd)
        if not self._polled and self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _poll(self) -> None:
        self._timer = None
        self.fallback_polls += 1
        self._handle_events()
        if self._polled and self._loop is not None and self._usb is not None:
            self._timer = self._loop.call_later(self.fallback_interval, self._poll)

    def _handle_events(self) -> None:
        if self._usb is None:
            return
        try:
            self._usb.handleEventsTimeout(0)
        except usb1.USBErrorInterrupted:
            pass
        except usb1.USBError as exc:  # a loop callback has nobody to raise to
            _log.warning("libusb event handling failed", error=repr(exc))
