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
:class:`aio_runtime.BudgetExhausted`), a pipe error → :class:`~transports.usb.UsbStall`, no device →
:class:`aio_runtime.DeviceLost` (the transport stays dead), a short transfer →
:class:`~transports.usb.ShortTransfer`, other USB errors → :class:`aio_runtime.TransferError`.

Runs on asyncio and on trio.
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import anyio
import usb.core  # type: ignore[import-untyped]
import usb.util  # type: ignore[import-untyped]

from aio_runtime import (
    Completion,
    Layer,
    LedgerKind,
    TransferError,
    UsbTransferTimeout,
    WaitBound,
    current_ledger,
    get_logger,
    map_exceptions,
    run_in_thread,
)

from ..protocol.bridge import BRIDGE_IDS, BRIDGE_PRODUCTS
from .backend import Payload, Setup, TransportBase
from .base import (
    TransferOutcome,
    UsbTransfer,
    library_timeout_ms,
    transfer_error,
)
from .discovery import BridgeSearch

__all__ = ["PyusbTransport", "open_pyusb_bridge", "pyusb_error", "pyusb_outcome"]

_LIBUSB_ERROR_NO_DEVICE, _LIBUSB_ERROR_PIPE = -4, -9
_log = get_logger(__name__)


def pyusb_outcome(exc: BaseException) -> tuple[TransferOutcome, str] | None:
    """What a pyusb call raised, as a :class:`~transports.usb.base.TransferOutcome` with what
    pyusb said (None: not pyusb's error)."""
    if isinstance(exc, usb.core.USBTimeoutError):
        return TransferOutcome.TIMED_OUT, ""
    if not isinstance(exc, usb.core.USBError):
        return None
    code = exc.backend_error_code
    if code == _LIBUSB_ERROR_PIPE:
        return TransferOutcome.STALL, f"{exc.strerror}"
    if code == _LIBUSB_ERROR_NO_DEVICE:
        return TransferOutcome.NO_DEVICE, ""
    return TransferOutcome.ERROR, f"{exc.strerror}"


def pyusb_error(exc: BaseException, bound: WaitBound) -> BaseException:
    """The runtime's error for what a pyusb call raised (``exc`` itself if it is not pyusb's)."""
    translated = pyusb_outcome(exc)
    if translated is None:
        return exc
    outcome, detail = translated
    return transfer_error(outcome, bound, detail)


class PyusbTransport(TransportBase):
    """A :class:`~transports.usb.UsbTransport` over a pyusb device whose interface
    ``interface`` is claimed (see :func:`open_pyusb_bridge`). A bulk OUT's ``data`` is used in
    place until its call returns."""

    def __init__(self, device: Any, *, interface: int = 0, drain_timeout: float = 1.0) -> None:
        super().__init__(drain_timeout=drain_timeout)
        self.device = device
        self.interface = interface
        self._last: dict[int, threading.Event] = {}
        """Per endpoint: set when the latest call started there has returned (calls on an
        endpoint run one after another, so then all of them have)."""

    def _call(self, endpoint: int, setup: Setup | None, payload: Payload) -> Callable[[int], Any]:
        """The blocking pyusb call of a transfer, given its timeout in ms."""
        device = self.device
        if setup is not None:
            return lambda ms: device.ctrl_transfer(*setup, payload, ms)
        if isinstance(payload, int):
            return lambda ms: device.read(endpoint, payload, ms)
        return lambda ms: device.write(endpoint, payload, ms)

    def _submit(
        self, bound: WaitBound, endpoint: int, setup: Setup | None, payload: Payload
    ) -> UsbTransfer[Any]:
        """Run the call on a new worker thread once the previous call on ``endpoint`` has
        returned."""
        call = self._call(endpoint, setup, payload)
        deadline = time.monotonic() + bound.remaining()  # the worker has no loop clock
        completion: Completion[tuple[str, Any]] = Completion()
        setter = completion.threadsafe_setter()
        ledger = current_ledger()
        entry = ledger.open(LedgerKind.USB_TRANSFER, bound.awaited)
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

        def finish(raw: tuple[str, Any]) -> Any:
            kind, value = raw
            if kind == "ok":  # an OUT call returns how many bytes it sent, an IN call the bytes
                if isinstance(payload, int):
                    return self._result(
                        bound, payload, TransferOutcome.COMPLETED, len(value), bytes(value)
                    )
                return self._result(bound, payload, TransferOutcome.COMPLETED, int(value))
            if kind == "expired":
                return self._result(bound, payload, TransferOutcome.TIMED_OUT)
            error = self._noted(pyusb_error(value, bound))
            if error is value:
                raise error
            raise error from value

        threading.Thread(target=work, name=f"pyusb: {bound.awaited}", daemon=True).start()
        return UsbTransfer(
            awaited=bound.awaited,
            bound=bound,
            completion=completion,
            cancel=lambda: None,  # a blocking pyusb call cannot be stopped; it ends by its timeout
            finish=finish,
            drain_timeout=self.drain_timeout,
        )

    async def reset(self, *, timeout: float | None = None) -> None:
        """A USB port reset, on a worker thread; a device that has gone: DeviceLost."""
        self._check_open("USB reset")
        bound = WaitBound(awaited="USB reset", error=UsbTransferTimeout, timeout=timeout)
        try:
            await run_in_thread(self.device.reset, awaited="USB reset", within=bound)
        except usb.core.USBError as exc:
            raise self._noted(pyusb_error(exc, bound)) from exc

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

        # (bounded twice over: a thread for the wait may itself be a wait, in anyio's pool)
        with anyio.CancelScope(shield=True), anyio.move_on_after(2 * self.drain_timeout):
            await anyio.to_thread.run_sync(wait_all, abandon_on_cancel=True)
        if any(not done.is_set() for done in running):
            _log.warning("pyusb calls still running at close; the device is left open")
            return
        try:
            usb.util.release_interface(self.device, self.interface)
        except usb.core.USBError:
            pass  # a device that went away has no interface to release
        usb.util.dispose_resources(self.device)


def _open_blocking(search: BridgeSearch) -> Any:
    for device in usb.core.find(
        find_all=True, custom_match=lambda d: search.wanted(d.idVendor, d.idProduct)
    ):
        if search.products is not None and not search.named(
            device.idVendor, device.idProduct, device.product or ""
        ):
            usb.util.dispose_resources(device)
            continue
        if device.is_kernel_driver_active(0):
            device.detach_kernel_driver(0)
            device.reset()
        device.set_configuration(1)
        usb.util.claim_interface(device, 0)
        device.set_interface_altsetting(interface=0, alternate_setting=0)
        return device
    raise search.not_found()


async def open_pyusb_bridge(
    *,
    timeout: float | None = None,
    ids: Iterable[tuple[int, int]] = BRIDGE_IDS,
    products: tuple[str, ...] | None = BRIDGE_PRODUCTS,
    drain_timeout: float = 1.0,
) -> PyusbTransport:
    """Find and open the bridge through pyusb, as
    :func:`~transports.usb.libusb_backend.open_bridge` does through python-libusb1."""
    search = BridgeSearch(ids, products)
    with map_exceptions(
        {usb.core.USBError: TransferError, usb.core.NoBackendError: TransferError},
        layer=Layer.USB_TRANSFER,
        awaited=search.awaited,
    ):
        device = await run_in_thread(
            lambda: _open_blocking(search),
            awaited=search.awaited,
            error=UsbTransferTimeout,
            timeout=timeout,
        )
    return PyusbTransport(device, drain_timeout=drain_timeout)
