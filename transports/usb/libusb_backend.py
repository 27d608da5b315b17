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
:class:`aio_runtime.BudgetExhausted`), stall → :class:`UsbStall`, no device →
:class:`aio_runtime.DeviceLost` (and the transport stays dead), fewer bytes than asked →
:class:`ShortTransfer`, anything else → :class:`aio_runtime.TransferError`. Every transfer is in the
current ledger ("usb transfer") from submit to callback.

:func:`open_bridge` finds and opens the USB-PCIe bridge (spec hardware-waits §4.2).

asyncio only: the context watches libusb's fds with the loop's ``add_reader``/``add_writer`` and
its timers (trio has neither; an anyio version would need a task per fd, and a sleeping task to poll
umockdev's fd). On trio use :class:`~transports.usb.pyusb_backend.PyusbTransport` (worker threads).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import anyio
import usb1  # type: ignore[import-untyped]

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
from .libusb_loop import LibusbContext

__all__ = [
    "BRIDGE_IDS",
    "BRIDGE_PRODUCTS",
    "LibusbContext",
    "LibusbTransport",
    "open_bridge",
    "transfer_outcome",
]

BRIDGE_IDS = ((0xADD1, 0x0001), (0x3801, 0x0001))
"""vendor:product of the USB-PCIe bridge."""
BRIDGE_PRODUCTS = ("custom", "AS2462")
"""What the bridge's product string starts with."""

_log = get_logger(__name__)
_Raw = tuple[int, int, bytes]
"""What a transfer's callback hands to the waiting task: status, actual length, IN data."""


_STATUS_NAMES = {
    usb1.TRANSFER_ERROR: "transfer error",
    usb1.TRANSFER_CANCELLED: "cancelled",
    usb1.TRANSFER_OVERFLOW: "overflow (the device sent more than was asked for)",
}


def transfer_outcome(
    status: int, actual: int, data: bytes, *, exact: int, is_in: bool, bound: WaitBound
) -> bytes | None:
    """A finished libusb transfer's result (IN data, or None) or its typed error.

    A transfer must move exactly ``exact`` bytes; libusb's own timeout is reported as the wait's
    (``bound.timed_out()``: a :class:`~aio_runtime.UsbTransferTimeout` or, when the enclosing
    scope was the earlier bound, :class:`~aio_runtime.BudgetExhausted`).
    """
    awaited = bound.awaited
    if status == usb1.TRANSFER_COMPLETED:
        require_length(awaited, actual, exact)
        return data if is_in else None
    if status == usb1.TRANSFER_TIMED_OUT:
        raise bound.timed_out()
    if status == usb1.TRANSFER_STALL:
        raise UsbStall(f"{awaited}: stall", awaited=awaited)
    if status == usb1.TRANSFER_NO_DEVICE:
        raise DeviceLost(f"{awaited}: no device", layer=Layer.USB_TRANSFER, awaited=awaited)
    name = _STATUS_NAMES.get(status, f"libusb status {status}")
    raise TransferError(f"{awaited}: {name}", awaited=awaited, layer=Layer.USB_TRANSFER)


_SUBMIT_ERRORS: dict[type[Exception], type[DeviceLost] | type[TransferError]] = {
    usb1.USBErrorNoDevice: DeviceLost,
    usb1.USBErrorPipe: UsbStall,
    usb1.USBError: TransferError,
}


class LibusbTransport:
    """A :class:`~transports.usb.UsbTransport` over one opened libusb device handle, whose
    interface ``interface`` is claimed. :meth:`aclose` cancels what is in flight, releases the
    interface and closes the handle."""

    def __init__(
        self,
        context: LibusbContext,
        handle: usb1.USBDeviceHandle,
        *,
        interface: int = 0,
        drain_timeout: float = 1.0,
    ) -> None:
        self.context = context
        self.handle = handle
        self.interface = interface
        self.drain_timeout = drain_timeout
        self._in_flight: dict[usb1.USBTransfer, Completion[_Raw]] = {}
        self._closed = False
        self._lost = False

    def _check_open(self, awaited: str) -> None:
        if self._closed:
            raise DeviceLost(f"{awaited}: transport closed", layer=Layer.USB_TRANSFER)
        if self._lost:
            raise DeviceLost(
                f"{awaited}: the device went away; open it again", layer=Layer.USB_TRANSFER
            )

    def _submit(
        self,
        awaited: str,
        timeout: float | None,
        fill: Callable[[usb1.USBTransfer, Callable[[usb1.USBTransfer], None], int], None],
        *,
        exact: int,
        is_in: bool,
    ) -> UsbTransfer[Any]:
        self._check_open(awaited)
        bound = WaitBound(awaited=awaited, error=UsbTransferTimeout, timeout=timeout)
        completion: Completion[_Raw] = Completion()
        ledger = current_ledger()
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

        entry = ledger.open("usb transfer", awaited)
        try:
            fill(transfer, callback, library_timeout_ms(bound.remaining()))
            with map_exceptions(_SUBMIT_ERRORS, layer=Layer.USB_TRANSFER, awaited=awaited):
                transfer.submit()
        except BaseException as exc:
            ledger.close(entry)
            transfer.close()
            self._lost = self._lost or isinstance(exc, DeviceLost)
            raise
        self._in_flight[transfer] = completion

        def cancel() -> None:
            try:
                transfer.cancel()
            except usb1.USBErrorNotFound:  # it has finished; its callback is on its way
                pass

        def finish(raw: _Raw) -> Any:
            try:
                return transfer_outcome(*raw, exact=exact, is_in=is_in, bound=bound)
            except DeviceLost:
                self._lost = True  # like the handle itself: dead until opened again
                raise

        return UsbTransfer(
            awaited=awaited,
            bound=bound,
            completion=completion,
            cancel=cancel,
            finish=finish,
            drain_timeout=self.drain_timeout,
        )

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

        def fill(t: usb1.USBTransfer, cb: Callable[[usb1.USBTransfer], None], ms: int) -> None:
            t.setControl(request_type, request, value, index, payload, callback=cb, timeout=ms)

        awaited = describe_control(False, request, value, index, len(payload))
        await self._submit(awaited, timeout, fill, exact=len(payload), is_in=False).wait()

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

        def fill(t: usb1.USBTransfer, cb: Callable[[usb1.USBTransfer], None], ms: int) -> None:
            t.setControl(request_type, request, value, index, length, callback=cb, timeout=ms)

        awaited = describe_control(True, request, value, index, length)
        result: bytes = await self._submit(awaited, timeout, fill, exact=length, is_in=True).wait()
        return result

    def submit_bulk_out(
        self, endpoint: int, data: bytes | bytearray | memoryview, *, timeout: float | None = None
    ) -> UsbTransfer[None]:
        """Start a bulk OUT. A writable buffer (bytearray) is sent in place, without a copy."""

        def fill(t: usb1.USBTransfer, cb: Callable[[usb1.USBTransfer], None], ms: int) -> None:
            t.setBulk(endpoint, data, callback=cb, timeout=ms)

        awaited = describe_bulk(endpoint, len(data))
        return self._submit(awaited, timeout, fill, exact=len(data), is_in=False)

    async def bulk_out(
        self, endpoint: int, data: bytes | bytearray | memoryview, *, timeout: float | None = None
    ) -> None:
        await self.submit_bulk_out(endpoint, data, timeout=timeout).wait()

    async def bulk_in(self, endpoint: int, length: int, *, timeout: float | None = None) -> bytes:
        def fill(t: usb1.USBTransfer, cb: Callable[[usb1.USBTransfer], None], ms: int) -> None:
            t.setBulk(endpoint, length, callback=cb, timeout=ms)

        awaited = describe_bulk(endpoint, length)
        result: bytes = await self._submit(awaited, timeout, fill, exact=length, is_in=True).wait()
        return result

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
        except DeviceLost:
            self._lost = True
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
    handle: usb1.USBDeviceHandle, bound: WaitBound, products: tuple[str, ...] | None
) -> str | None:
    """Check the product string and claim the interface, on worker threads (they block); the
    product string when it does not match (and nothing is claimed), else None."""
    awaited = bound.awaited
    if products is not None:
        name: str = await run_in_thread(
            lambda: handle.getProduct() or "", awaited=f"{awaited}: product string", within=bound
        )
        if not name.startswith(products):
            return name
    await run_in_thread(
        lambda: _claim(handle), awaited=f"{awaited}: claim interface 0", within=bound
    )
    return None


async def open_bridge(
    context: LibusbContext,
    *,
    timeout: float | None = None,
    ids: Iterable[tuple[int, int]] = BRIDGE_IDS,
    products: tuple[str, ...] | None = BRIDGE_PRODUCTS,
    drain_timeout: float = 1.0,
) -> LibusbTransport:
    """Find and open the bridge: the first device with one of ``ids`` whose product string starts
    with one of ``products`` (None: do not check); detach a kernel driver from interface 0 (then
    reset), set configuration 1, claim interface 0, alternate setting 0 — all within ``timeout``
    (and the enclosing deadline).

    Devices are opened and closed on the loop thread (libusb adds and removes their fds there);
    the blocking steps — reading the product string, claiming — run on worker threads. None
    found: :class:`aio_runtime.DeviceLost`; libusb errors: ``DeviceLost`` (gone) or
    :class:`aio_runtime.TransferError`.
    """
    awaited = "open the USB-PCIe bridge"
    bound = WaitBound(awaited=awaited, error=UsbTransferTimeout, timeout=timeout)
    wanted = set(ids)
    skipped: list[str] = []
    with map_exceptions(
        {usb1.USBErrorNoDevice: DeviceLost, usb1.USBError: TransferError},
        layer=Layer.USB_TRANSFER,
        awaited=awaited,
    ):
        for device in context.usb.getDeviceIterator(skip_on_error=True):
            ident = (device.getVendorID(), device.getProductID())
            if ident not in wanted:
                continue
            handle = device.open()
            try:
                mismatch = await _prepare(handle, bound, products)
            except BaseException as exc:
                if not getattr(exc, "in_flight", False):  # else a worker still uses the handle
                    handle.close()
                raise
            if mismatch is None:
                return LibusbTransport(context, handle, drain_timeout=drain_timeout)
            skipped.append(f"{ident[0]:04x}:{ident[1]:04x} {mismatch!r}")
            handle.close()
    looked_for = ", ".join(f"{v:04x}:{p:04x}" for v, p in sorted(wanted))
    detail = f"; skipped (product string): {', '.join(skipped)}" if skipped else ""
    raise DeviceLost(
        f"no USB-PCIe bridge on the bus (looked for {looked_for}){detail}",
        layer=Layer.USB_TRANSFER,
        awaited=awaited,
    )
