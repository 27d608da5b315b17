"""The pyusb backend: blocking pyusb calls on worker threads, each bounded by its own USB timeout.

pyusb has no asynchronous API, so every transfer is a blocking call on a worker thread, and the
event loop awaits its completion like any other hardware completion (bounded, typed errors).

**A pyusb call cannot be cancelled from the event loop.** It ends only by completing or by pyusb's
own timeout, so each call's pyusb timeout is the time left in its bound — its ``timeout=`` and the
enclosing deadline scope — in whole milliseconds rounded up, never 0 (which pyusb reads as "wait
forever"). When the wait's bound is reached first, or the waiting task is cancelled, the wait
continues (shielded, for at most ``drain_timeout``) until the call has returned; a call that has not
returned by then is reported (``in_flight`` on the timeout, a note on the error), stays in the
ledger, and keeps its buffer: a ``bytearray`` handed to :meth:`PyusbTransport.submit_bulk_out` must
not be reused until the call is over.

Transfers on one endpoint run one after another, in the order they were started, so transfers on
an endpoint complete in submission order as the interface requires: a second bulk OUT "in flight"
waits on its thread for the first to finish (its bound runs meanwhile). Errors map onto the same
family as the other backends: pyusb's timeout → :class:`aio_runtime.UsbTransferTimeout` (or
:class:`aio_runtime.BudgetExhausted`), a pipe error → :class:`UsbStall`, no device →
:class:`aio_runtime.DeviceLost` (the transport stays dead), a short transfer →
:class:`ShortTransfer`, other USB errors → :class:`aio_runtime.TransferError`.

Runs on asyncio and on trio.
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import anyio
import usb.core  # type: ignore[import-untyped]
import usb.util  # type: ignore[import-untyped]

from aio_runtime import (
    Completion,
    DeviceLost,
    Layer,
    TransferError,
    UsbTransferTimeout,
    WaitBound,
    current_ledger,
    get_logger,
    map_exceptions,
    run_in_thread,
)

from .base import (
    UsbStall,
    UsbTransfer,
    describe_bulk,
    describe_control,
    library_timeout_ms,
    require_length,
)

__all__ = ["PyusbTransport", "open_pyusb_bridge", "pyusb_error"]

T = TypeVar("T")
_LIBUSB_ERROR_NO_DEVICE, _LIBUSB_ERROR_PIPE = -4, -9
_log = get_logger(__name__)


def pyusb_error(exc: BaseException, bound: WaitBound) -> BaseException:
    """The runtime's error for what a pyusb call raised (``exc`` itself if it is not pyusb's)."""
    awaited = bound.awaited
    if isinstance(exc, usb.core.USBTimeoutError):
        return bound.timed_out()
    if not isinstance(exc, usb.core.USBError):
        return exc
    code = exc.backend_error_code
    if code == _LIBUSB_ERROR_PIPE:
        return UsbStall(f"{awaited}: stall ({exc.strerror})", awaited=awaited)
    if code == _LIBUSB_ERROR_NO_DEVICE:
        return DeviceLost(f"{awaited}: no device", layer=Layer.USB_TRANSFER, awaited=awaited)
    return TransferError(f"{awaited}: {exc.strerror}", awaited=awaited, layer=Layer.USB_TRANSFER)


class PyusbTransport:
    """A :class:`~transports.usb.UsbTransport` over a pyusb device whose interface
    ``interface`` is claimed (see :func:`open_pyusb_bridge`)."""

    def __init__(self, device: Any, *, interface: int = 0, drain_timeout: float = 1.0) -> None:
        self.device = device
        self.interface = interface
        self.drain_timeout = drain_timeout
        self._last: dict[int, threading.Event] = {}
        """Per endpoint: set when the latest call started there has returned (calls on an
        endpoint run one after another, so then all of them have)."""
        self._closed = False
        self._lost = False

    def _check_open(self, awaited: str) -> None:
        if self._closed:
            raise DeviceLost(f"{awaited}: transport closed", layer=Layer.USB_TRANSFER)
        if self._lost:
            raise DeviceLost(
                f"{awaited}: the device went away; open it again", layer=Layer.USB_TRANSFER
            )

    def _start(
        self,
        endpoint: int,
        awaited: str,
        timeout: float | None,
        call: Callable[[int], Any],
        result: Callable[[Any], T],
    ) -> UsbTransfer[T]:
        """Run ``call(timeout_ms)`` on a new worker thread once the previous call on ``endpoint``
        has returned; the transfer's result is ``result(what the call returned)``."""
        self._check_open(awaited)
        bound = WaitBound(awaited=awaited, error=UsbTransferTimeout, timeout=timeout)
        deadline = time.monotonic() + bound.remaining()  # the worker has no loop clock
        completion: Completion[tuple[str, Any]] = Completion()
        setter = completion.threadsafe_setter()
        ledger = current_ledger()
        entry = ledger.open("usb transfer", awaited)
        previous, done = self._last.get(endpoint), threading.Event()
        self._last[endpoint] = done
        context = contextvars.copy_context()

        def work() -> None:
            outcome: tuple[str, Any]
            try:
                if previous is not None:
                    previous.wait(max(0.0, deadline - time.monotonic()))
                remaining = deadline - time.monotonic()
                if remaining <= 0 or (previous is not None and not previous.is_set()):
                    outcome = ("expired", None)  # its bound ran out behind an earlier call
                else:
                    outcome = ("ok", context.run(call, library_timeout_ms(remaining)))
            except BaseException as exc:  # handed to the waiting task
                outcome = ("error", exc)
            finally:
                done.set()
                ledger.close(entry)
            setter.set_result(outcome)

        def finish(raw: tuple[str, Any]) -> T:
            kind, value = raw
            if kind == "ok":
                return result(value)
            if kind == "expired":
                raise bound.timed_out()
            error = pyusb_error(value, bound)
            if isinstance(error, DeviceLost):
                self._lost = True  # like a libusb handle after an unplug: dead for good
            if error is value:
                raise error
            raise error from value

        threading.Thread(target=work, name=f"pyusb: {awaited}", daemon=True).start()
        return UsbTransfer(
            awaited=awaited,
            bound=bound,
            completion=completion,
            cancel=lambda: None,  # a blocking pyusb call cannot be stopped; it ends by its timeout
            finish=finish,
            drain_timeout=self.drain_timeout,
        )

    @staticmethod
    def _sent(exact: int, awaited: str) -> Callable[[int], None]:
        """An OUT call returns how many bytes it sent: all of them, or ShortTransfer."""

        def check(count: int) -> None:
            require_length(awaited, int(count), exact)

        return check

    @staticmethod
    def _received(exact: int, awaited: str) -> Callable[[Any], bytes]:
        """An IN call returns the bytes it received: exactly ``exact``, or ShortTransfer."""

        def check(data: Any) -> bytes:
            require_length(awaited, len(data), exact)
            return bytes(data)

        return check

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
        if request_type & 0x80:
            raise ValueError(f"control OUT 0x{request:02x} with an IN request type")
        payload = bytes(data)
        awaited = describe_control(False, request, value, index, len(payload))
        await self._start(
            0,
            awaited,
            timeout,
            lambda ms: self.device.ctrl_transfer(request_type, request, value, index, payload, ms),
            self._sent(len(payload), awaited),
        ).wait()

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
        if not request_type & 0x80:
            raise ValueError(f"control IN 0x{request:02x} with an OUT request type")
        awaited = describe_control(True, request, value, index, length)
        return await self._start(
            0,
            awaited,
            timeout,
            lambda ms: self.device.ctrl_transfer(request_type, request, value, index, length, ms),
            self._received(length, awaited),
        ).wait()

    def submit_bulk_out(
        self, endpoint: int, data: bytes | bytearray | memoryview, *, timeout: float | None = None
    ) -> UsbTransfer[None]:
        """Start a bulk OUT on a worker thread. ``data`` is used in place until the call returns."""
        awaited = describe_bulk(endpoint, len(data))
        return self._start(
            endpoint,
            awaited,
            timeout,
            lambda ms: self.device.write(endpoint, data, ms),
            self._sent(len(data), awaited),
        )

    async def bulk_out(
        self, endpoint: int, data: bytes | bytearray | memoryview, *, timeout: float | None = None
    ) -> None:
        await self.submit_bulk_out(endpoint, data, timeout=timeout).wait()

    async def bulk_in(self, endpoint: int, length: int, *, timeout: float | None = None) -> bytes:
        awaited = describe_bulk(endpoint, length)
        return await self._start(
            endpoint,
            awaited,
            timeout,
            lambda ms: self.device.read(endpoint, length, ms),
            self._received(length, awaited),
        ).wait()

    async def reset(self, *, timeout: float | None = None) -> None:
        """A USB port reset, on a worker thread; a device that has gone: DeviceLost."""
        self._check_open("USB reset")
        bound = WaitBound(awaited="USB reset", error=UsbTransferTimeout, timeout=timeout)
        try:
            await run_in_thread(self.device.reset, awaited="USB reset", within=bound)
        except usb.core.USBError as exc:
            error = pyusb_error(exc, bound)
            self._lost = self._lost or isinstance(error, DeviceLost)
            raise error from exc

    async def aclose(self) -> None:
        """Wait (shielded, at most ``drain_timeout``) for calls still running, then release the
        interface and pyusb's resources. With a call still running they are left alone: freeing
        them under it would pull libusb's handle from beneath the call."""
        if self._closed:
            return
        self._closed = True
        running = [done for done in self._last.values() if not done.is_set()]
        deadline = time.monotonic() + self.drain_timeout

        def wait_all() -> None:  # on a thread: these are threading events
            for done in running:
                done.wait(max(0.0, deadline - time.monotonic()))

        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(wait_all)
        if any(not done.is_set() for done in running):
            _log.warning("pyusb calls still running at close; the device is left open")
            return
        try:
            usb.util.release_interface(self.device, self.interface)
        except usb.core.USBError:
            pass  # a device that went away has no interface to release
        usb.util.dispose_resources(self.device)


def _open_blocking(ids: Iterable[tuple[int, int]], products: tuple[str, ...] | None) -> Any:
    wanted = set(ids)
    skipped: list[str] = []
    for device in usb.core.find(
        find_all=True, custom_match=lambda d: (d.idVendor, d.idProduct) in wanted
    ):
        if products is not None:
            name = device.product or ""
            if not name.startswith(products):
                skipped.append(f"{device.idVendor:04x}:{device.idProduct:04x} {name!r}")
                usb.util.dispose_resources(device)
                continue
        if device.is_kernel_driver_active(0):
            device.detach_kernel_driver(0)
            device.reset()
        device.set_configuration(1)
        usb.util.claim_interface(device, 0)
        device.set_interface_altsetting(interface=0, alternate_setting=0)
        return device
    looked_for = ", ".join(f"{v:04x}:{p:04x}" for v, p in sorted(wanted))
    detail = f"; skipped (product string): {', '.join(skipped)}" if skipped else ""
    raise DeviceLost(
        f"no USB-PCIe bridge on the bus (looked for {looked_for}){detail}",
        layer=Layer.USB_TRANSFER,
        awaited="open the USB-PCIe bridge",
    )


async def open_pyusb_bridge(
    *,
    timeout: float | None = None,
    ids: Iterable[tuple[int, int]] = ((0xADD1, 0x0001), (0x3801, 0x0001)),
    products: tuple[str, ...] | None = ("custom", "AS2462"),
    drain_timeout: float = 1.0,
) -> PyusbTransport:
    """Find and open the bridge through pyusb, as
    :func:`~transports.usb.libusb_backend.open_bridge` does through python-libusb1."""
    chosen = tuple(ids)
    with map_exceptions(
        {usb.core.USBError: TransferError, usb.core.NoBackendError: TransferError},
        layer=Layer.USB_TRANSFER,
        awaited="open the USB-PCIe bridge",
    ):
        device = await run_in_thread(
            lambda: _open_blocking(chosen, products),
            awaited="open the USB-PCIe bridge",
            error=UsbTransferTimeout,
            timeout=timeout,
        )
    return PyusbTransport(device, drain_timeout=drain_timeout)
