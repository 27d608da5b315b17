"""The USB transport interface and its errors.

Every transfer is bounded — ``timeout=`` or the enclosing :func:`aio_runtime.deadline_scope` —
and ends in one of: success; :class:`aio_runtime.UsbTransferTimeout` (or
:class:`aio_runtime.BudgetExhausted`); :class:`UsbStall` (the device refused the request);
:class:`ShortTransfer` (fewer bytes than the protocol requires); :class:`aio_runtime.DeviceLost`
with layer ``usb-transfer`` (no device). Backends translate their library's errors into these at
the boundary. After ``DeviceLost`` the transport is dead, as a libusb handle is after an unplug:
every later call fails the same way until the device is opened again.

Each call owns its buffer until it returns, and returns only once the device (or the library) has
let go of it.
"""

from __future__ import annotations

from typing import Protocol

from aio_runtime import Layer, TransferError

__all__ = ["CONTROL_IN", "CONTROL_OUT", "ShortTransfer", "UsbStall", "UsbTransport"]

CONTROL_OUT = 0x40
"""bmRequestType of a vendor request to the device."""
CONTROL_IN = 0xC0
"""bmRequestType of a vendor request from the device."""


class UsbStall(TransferError):
    """The device stalled the endpoint: it refused the request."""

    default_layer = Layer.USB_TRANSFER


class ShortTransfer(TransferError):
    """A transfer moved fewer bytes than the protocol requires."""

    default_layer = Layer.USB_TRANSFER

    def __init__(self, message: str, *, expected: int, actual: int, awaited: str = "") -> None:
        super().__init__(message, awaited=awaited)
        self.expected = expected
        self.actual = actual


class UsbTransport(Protocol):
    """One opened USB device."""

    async def control_out(
        self,
        request_type: int,
        request: int,
        value: int,
        index: int,
        data: bytes = b"",
        *,
        timeout: float | None = None,
    ) -> None: ...

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
        """Exactly ``length`` bytes, or :class:`ShortTransfer`."""
        ...

    async def bulk_out(self, endpoint: int, data: bytes, *, timeout: float | None = None) -> None:
        """All of ``data``, or :class:`ShortTransfer`."""
        ...

    async def bulk_in(self, endpoint: int, length: int, *, timeout: float | None = None) -> bytes:
        """Exactly ``length`` bytes, or :class:`ShortTransfer`."""
        ...

    async def reset(self, *, timeout: float | None = None) -> None:
        """Reset the device (a USB port reset): it forgets transfers in progress."""
        ...

    async def aclose(self) -> None: ...
