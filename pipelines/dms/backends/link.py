"""How the accelerator is reached between and during its sessions: one USB transport in use at a
time (:class:`AcceleratorLink`), and the probe by which its supervisor knows the device answers.

A session's transport is lent to it watched (:class:`LentTransport`): every call passes through,
and the bridge's control transfers in flight are kept with when they began. A control transfer
takes the bridge a millisecond; one still unanswered after :attr:`AcceleratorLink.lost_after`
while the bridge answers the probe at once was lost (a fault the device has got over, however
briefly it lasted), and that session's open waits for it in vain until its own bound.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Iterator

import anyio

from aio_runtime import DeviceLost, now
from transports.gpu import bridge_answers
from transports.protocol.bridge import VendorRequest
from transports.usb import UsbTransfer, UsbTransport

__all__ = ["AcceleratorLink", "LentTransport", "TransportOpener"]

TransportOpener = Callable[[], Awaitable[UsbTransport]]
"""Opens a fresh USB transport to the accelerator, for one session (which then owns it)."""

CLOSE_TIMEOUT = 1.0
"""How long closing a probe's transport may take (it has nothing in flight)."""


class LentTransport:
    """A session's transport (:attr:`usb`), watched: its control transfers in flight, each with
    when it began — except PCIe power-on, which may take the bridge seconds."""

    def __init__(self, usb: UsbTransport) -> None:
        self.usb = usb
        self._in_flight: dict[object, float] = {}
        self._reported: set[object] = set()

    @contextlib.contextmanager
    def _watched(self, request: int) -> Iterator[None]:
        if request == VendorRequest.POWER:
            yield
            return
        token = object()
        self._in_flight[token] = now()
        try:
            yield
        finally:
            del self._in_flight[token]
            self._reported.discard(token)

    def lost_since(self, before: float) -> bool:
        """Whether a control transfer begun before ``before`` (loop clock) is still unanswered —
        told once per transfer."""
        lost = [t for t, began in self._in_flight.items() if began < before]
        new = [t for t in lost if t not in self._reported]
        self._reported.update(new)
        return bool(new)

    async def control_out(
        self,
        request_type: int,
        request: int,
        value: int,
        index: int,
        data: bytes = b"",
        *,
        timeout: float | None = None,
    ) -> None:
        with self._watched(request):
            await self.usb.control_out(request_type, request, value, index, data, timeout=timeout)

    async def control_in(
        self,
        request_type: int,
        request: int,
        value: int,
        index: int,
        length: int,
        *,
        timeout: float | None = None,
    ) -> bytes:
        with self._watched(request):
            return await self.usb.control_in(
                request_type, request, value, index, length, timeout=timeout
            )

    async def bulk_out(
        self, endpoint: int, data: bytes | bytearray | memoryview, *, timeout: float | None = None
    ) -> None:
        await self.usb.bulk_out(endpoint, data, timeout=timeout)

    async def bulk_in(self, endpoint: int, length: int, *, timeout: float | None = None) -> bytes:
        return await self.usb.bulk_in(endpoint, length, timeout=timeout)

    def submit_bulk_out(
        self, endpoint: int, data: bytes | bytearray | memoryview, *, timeout: float | None = None
    ) -> UsbTransfer[None]:
        return self.usb.submit_bulk_out(endpoint, data, timeout=timeout)

    async def reset(self, *, timeout: float | None = None) -> None:
        await self.usb.reset(timeout=timeout)

    async def aclose(self) -> None:
        await self.usb.aclose()


class AcceleratorLink:
    """The accelerator's USB transports, one in use at a time: a session's while it opens and
    runs; between sessions, the probe's own, which the next session takes over. The device is
    so never opened twice at once (a second handle could not claim its interface). Leaving
    ``async with`` closes the probe's transport, if it has one."""

    def __init__(self, opener: TransportOpener, *, probe_timeout: float) -> None:
        self._opener = opener
        self.probe_timeout = probe_timeout
        """The bound of a probe's bridge read."""
        self.lost_after = 2 * probe_timeout
        """How long a session's control transfer may go unanswered, while the bridge answers a
        probe within :attr:`probe_timeout`, before it counts as lost."""
        self._spare: UsbTransport | None = None
        self._session: LentTransport | None = None
        self._opening = False
        """A session's transport is being opened."""
        self._lock = anyio.Lock()

    async def take(self) -> LentTransport:
        """A transport for a session, which then owns it (the probe's, if it has one open);
        :meth:`give_back` it once the session has ended."""
        async with self._lock:
            usb, self._spare = self._spare, None
            if usb is None:
                self._opening = True
                try:
                    usb = await self._opener()
                finally:
                    self._opening = False
            self._session = LentTransport(usb)
            return self._session

    def give_back(self, lent: LentTransport) -> None:
        """The session that took ``lent`` has ended (and closed it)."""
        if self._session is lent:
            self._session = None

    async def probe(self) -> bool | None:
        """Whether the bridge answers one read within :attr:`probe_timeout` — and, while a
        session holds a transport, answered it too: a control transfer of the session's lost
        (see the module) makes one probe say no. Over the session's transport while it holds
        one (unless its device went away), else over the probe's own, opened if need be; one
        whose device went away is closed, and the next probe opens another. While a session's
        transport is being opened, that opening is the probe (a device that is not there fails
        it): the probe has no news (None), and opens no second one beside it."""
        if self._opening:
            return None
        lent = self._session
        if lent is not None:
            answered = await self._ask(lent)
            if answered is not None:
                return answered
        async with self._lock:
            taken = self._session if self._session is not lent else None
            if taken is None and self._spare is None:
                self._spare = await self._opener()
            usb = self._spare
        if taken is not None:  # a session took a transport meanwhile: ask over it
            return bool(await self._ask(taken))
        assert usb is not None
        try:
            return await bridge_answers(usb, timeout=self.probe_timeout)
        except DeviceLost:
            if usb is self._spare:
                self._spare = None
                await _close(usb)
            return False

    async def _ask(self, lent: LentTransport) -> bool | None:
        """The probe over a session's transport; None if its device went away (only a new
        transport can tell whether it is back)."""
        began = now()
        try:
            answered = await bridge_answers(lent.usb, timeout=self.probe_timeout)
        except DeviceLost:
            return None
        return answered and not lent.lost_since(began - self.lost_after)

    async def __aenter__(self) -> AcceleratorLink:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        spare, self._spare = self._spare, None
        if spare is not None:
            await _close(spare)


async def _close(usb: UsbTransport) -> None:
    with anyio.CancelScope(shield=True), anyio.move_on_after(CLOSE_TIMEOUT):
        await usb.aclose()
