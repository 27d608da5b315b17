"""The libusb backend: asynchronous libusb transfers driven by the asyncio event loop.

Transfers are submitted asynchronously and completed by libusb's callbacks, which run on the loop
thread because a :class:`~transports.usb.libusb_loop.LibusbContext` lets the loop handle libusb's
events (its fds watched by the loop's selector; no thread sits in libusb).

:class:`LibusbTransport` is a :class:`~transports.usb.UsbTransport` over one opened device. Each
transfer is bounded like every wait (``timeout=`` and the enclosing deadline scope) and libusb gets
the same bound as its own per-transfer timeout: the time left, in whole milliseconds rounded up,
never 0 (which libusb reads as "no timeout"). When the wait ends first (its bound, or the task is
cancelled) the transfer is cancelled and its callback awaited — shielded, for at most
``drain_timeout`` — before the error propagates: libusb owns the buffer until that callback.
Outcomes map onto the typed family: timed out → :class:`aio_runtime.UsbTransferTimeout` (or
:class:`aio_runtime.BudgetExhausted`), stall → :class:`~transports.usb.UsbStall`, no device →
:class:`aio_runtime.DeviceLost` (and the transport stays dead), fewer bytes than asked →
:class:`~transports.usb.ShortTransfer`, anything else → :class:`aio_runtime.TransferError`.
Every transfer is in the current ledger ("usb transfer") from submit to callback.

:func:`open_bridge` finds and opens the USB-PCIe bridge (spec hardware-waits §4.2).

asyncio only: the context watches libusb's fds with the loop's ``add_reader``/``add_writer`` and
its timers (trio has neither; an anyio version would need a task per fd, and a sleeping task to poll
umockdev's fd). On trio use :class:`~transports.usb.pyusb_backend.PyusbTransport` (worker threads).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import anyio
import usb1  # type: ignore[import-untyped]

from aio_runtime import (
    Completion,
    DeviceLost,
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
    UsbStall,
    UsbTransfer,
    library_timeout_ms,
    outcome_result,
)
from .discovery import BridgeSearch
from .libusb_loop import LibusbContext

__all__ = ["LibusbContext", "LibusbTransport", "libusb_outcome", "open_bridge", "transfer_outcome"]

_log = get_logger(__name__)
_Raw = tuple[int, int, bytes]
"""What a transfer's callback hands to the waiting task: status, actual length, IN data."""


_OUTCOMES: dict[int, tuple[TransferOutcome, str]] = {
    usb1.TRANSFER_COMPLETED: (TransferOutcome.COMPLETED, ""),
    usb1.TRANSFER_TIMED_OUT: (TransferOutcome.TIMED_OUT, ""),
    usb1.TRANSFER_STALL: (TransferOutcome.STALL, ""),
    usb1.TRANSFER_NO_DEVICE: (TransferOutcome.NO_DEVICE, ""),
    usb1.TRANSFER_CANCELLED: (TransferOutcome.CANCELLED, ""),
    usb1.TRANSFER_ERROR: (TransferOutcome.ERROR, "transfer error"),
    usb1.TRANSFER_OVERFLOW: (
        TransferOutcome.ERROR,
        "overflow (the device sent more than was asked for)",
    ),
}


def libusb_outcome(status: int) -> tuple[TransferOutcome, str]:
    """A libusb transfer status as a :class:`~transports.usb.base.TransferOutcome`, with what
    libusb said."""
    return _OUTCOMES.get(status, (TransferOutcome.ERROR, f"libusb status {status}"))


def transfer_outcome(
    status: int, actual: int, data: bytes, *, exact: int, is_in: bool, bound: WaitBound
) -> bytes | None:
    """A finished libusb transfer's result (IN data, or None) or its typed error
    (:func:`~transports.usb.base.outcome_result`): libusb's own timeout is reported as the
    wait's (``bound.timed_out()``: a :class:`~aio_runtime.UsbTransferTimeout` or, when the
    enclosing scope was the earlier bound, :class:`~aio_runtime.BudgetExhausted`)."""
    outcome, detail = libusb_outcome(status)
    return outcome_result(
        outcome, actual, data, exact=exact, is_in=is_in, bound=bound, detail=detail
    )


_SUBMIT_ERRORS: dict[type[Exception], type[DeviceLost] | type[TransferError]] = {
    usb1.USBErrorNoDevice: DeviceLost,
    usb1.USBErrorPipe: UsbStall,
    usb1.USBError: TransferError,
}


class LibusbTransport(TransportBase):
    """A :class:`~transports.usb.UsbTransport` over one opened libusb device handle, whose
    interface ``interface`` is claimed. A bulk OUT's buffer, when writable (a bytearray), is sent
    in place, without a copy. :meth:`aclose` cancels what is in flight, releases the interface and
    closes the handle."""

    def __init__(
        self,
        context: LibusbContext,
        handle: usb1.USBDeviceHandle,
        *,
        interface: int = 0,
        drain_timeout: float = 1.0,
    ) -> None:
        super().__init__(drain_timeout=drain_timeout)
        self.context = context
        self.handle = handle
        self.interface = interface
        self._in_flight: dict[usb1.USBTransfer, Completion[_Raw]] = {}

    def _submit(
        self, bound: WaitBound, endpoint: int, setup: Setup | None, payload: Payload
    ) -> UsbTransfer[Any]:
        is_in = isinstance(payload, int)
        completion: Completion[_Raw] = Completion()
        transfer = self.handle.getTransfer()

        def completed(status: int, actual: int, data: bytes) -> None:
            ledger.close(entry)
            self._in_flight.pop(transfer, None)
            completion.set_result((status, actual, data))

        def callback(done: usb1.USBTransfer) -> None:  # inside libusb's event handling
            status, actual = done.getStatus(), done.getActualLength()
            data = bytes(done.getBuffer()[:actual]) if is_in else b""
            done.doom()  # python-libusb1 frees it once this callback returns
            self.context.on_loop(lambda: completed(status, actual, data))

        ledger = current_ledger()
        entry = ledger.open(LedgerKind.USB_TRANSFER, bound.awaited)
        try:
            ms = library_timeout_ms(bound.remaining())
            if setup is None:
                transfer.setBulk(endpoint, payload, callback=callback, timeout=ms)
            else:
                transfer.setControl(*setup, payload, callback=callback, timeout=ms)
            with map_exceptions(_SUBMIT_ERRORS, layer=Layer.USB_TRANSFER, awaited=bound.awaited):
                transfer.submit()
        except BaseException as exc:
            ledger.close(entry)
            transfer.close()
            self._noted(exc)
            raise
        self._in_flight[transfer] = completion

        def cancel() -> None:
            try:
                transfer.cancel()
            except usb1.USBErrorNotFound:  # it has finished; its callback is on its way
                pass

        def finish(raw: _Raw) -> Any:
            status, actual, data = raw
            outcome, detail = libusb_outcome(status)
            return self._result(bound, payload, outcome, actual, data, detail)

        return UsbTransfer(
            awaited=bound.awaited,
            bound=bound,
            completion=completion,
            cancel=cancel,
            finish=finish,
            drain_timeout=self.drain_timeout,
        )

    async def reset(self, *, timeout: float | None = None) -> None:
        """A USB port reset (libusb_reset_device, on a worker thread: it blocks). Transfers in
        flight end cancelled. A device that re-enumerated must be opened again: DeviceLost."""
        self._check_open("USB reset")
        try:
            with map_exceptions(
                {usb1.USBErrorNotFound: DeviceLost, usb1.USBErrorNoDevice: DeviceLost},
                layer=Layer.USB_TRANSFER,
                awaited="USB reset",
            ):
                await run_in_thread(
                    self.handle.resetDevice,
                    awaited="USB reset",
                    error=UsbTransferTimeout,
                    timeout=timeout,
                )
        except DeviceLost as exc:
            self._noted(exc)
            raise

    async def aclose(self) -> None:
        """Cancel transfers in flight and await their callbacks (shielded, at most
        ``drain_timeout``), then release the interface and close the handle. A transfer libusb
        has not given back by then keeps the handle open (closing it would block the loop)."""
        if self._closed:
            return
        self._closed = True
        pending = list(self._in_flight.items())
        for transfer, _ in pending:
            try:
                transfer.cancel()
            except usb1.USBError:
                pass
        with anyio.CancelScope(shield=True), anyio.move_on_after(self.drain_timeout):
            for _, completion in pending:
                await completion.wait()
        if self._in_flight:
            _log.warning(
                "USB transfers still in flight at close; the device handle is left open",
                transfers=len(self._in_flight),
            )
            return
        try:
            self.handle.releaseInterface(self.interface)
        except usb1.USBError:
            pass  # a device that went away has no interface to release
        self.handle.close()


def _claim(handle: usb1.USBDeviceHandle) -> None:
    """Blocking: detach a kernel driver from interface 0 (then reset), set configuration 1,
    claim interface 0, alternate setting 0."""
    if handle.kernelDriverActive(0):
        handle.detachKernelDriver(0)
        handle.resetDevice()
    handle.setConfiguration(1)
    handle.claimInterface(0)
    handle.setInterfaceAltSetting(0, 0)


async def _prepare(
    handle: usb1.USBDeviceHandle, ident: tuple[int, int], search: BridgeSearch, bound: WaitBound
) -> bool:
    """Check the product string and claim the interface, on worker threads (they block); False
    when the product string is not the bridge's (and nothing is claimed)."""
    awaited = bound.awaited
    if search.products is not None:
        name: str = await run_in_thread(
            lambda: handle.getProduct() or "", awaited=f"{awaited}: product string", within=bound
        )
        if not search.named(*ident, name):
            return False
    await run_in_thread(
        lambda: _claim(handle), awaited=f"{awaited}: claim interface 0", within=bound
    )
    return True


async def open_bridge(
    context: LibusbContext,
    *,
    timeout: float | None = None,
    ids: Iterable[tuple[int, int]] = BRIDGE_IDS,
    products: tuple[str, ...] | None = BRIDGE_PRODUCTS,
    drain_timeout: float = 1.0,
) -> LibusbTransport:
    """Find and open the bridge (:class:`~transports.usb.discovery.BridgeSearch`): the first device
    with one of ``ids`` whose product string starts with one of ``products`` (None: do not
    check); detach a kernel driver from interface 0 (then reset), set configuration 1, claim
    interface 0, alternate setting 0 — all within ``timeout`` (and the enclosing deadline).

    Devices are opened and closed on the loop thread (libusb adds and removes their fds there);
    the blocking steps — reading the product string, claiming — run on worker threads. None
    found: :class:`aio_runtime.DeviceLost`; libusb errors: ``DeviceLost`` (gone) or
    :class:`aio_runtime.TransferError`.
    """
    search = BridgeSearch(ids, products)
    bound = WaitBound(awaited=search.awaited, error=UsbTransferTimeout, timeout=timeout)
    with map_exceptions(
        {usb1.USBErrorNoDevice: DeviceLost, usb1.USBError: TransferError},
        layer=Layer.USB_TRANSFER,
        awaited=search.awaited,
    ):
        for device in context.usb.getDeviceIterator(skip_on_error=True):
            ident = (device.getVendorID(), device.getProductID())
            if not search.wanted(*ident):
                continue
            handle = device.open()
            try:
                if await _prepare(handle, ident, search, bound):
                    return LibusbTransport(context, handle, drain_timeout=drain_timeout)
            except BaseException as exc:
                if not getattr(exc, "in_flight", False):  # else a worker still uses the handle
                    handle.close()
                raise
            handle.close()
    raise search.not_found()
