"""What every USB backend shares: :class:`TransportBase`, a :class:`~transports.usb.UsbTransport`
built on one abstract :meth:`~TransportBase._submit`.

It holds the closed and lost states, checks request types, and builds the transfer calls
(control OUT and IN, bulk OUT and IN, and ``submit_bulk_out``) on ``_submit``. A backend starts
one transfer with its library, and reports how it ended as a
:class:`~transports.usb.base.TransferOutcome` through :meth:`TransportBase._result`, which maps
it onto the typed family (:func:`~transports.usb.base.outcome_result`).
"""

from __future__ import annotations

import abc
from typing import Any

from aio_runtime import AsyncResource, DeviceLost, Layer, UsbTransferTimeout, WaitBound

from .base import (
    TransferOutcome,
    UsbTransfer,
    describe_bulk,
    describe_control,
    outcome_result,
)

__all__ = ["Payload", "Setup", "TransportBase"]

Setup = tuple[int, int, int, int]
"""A control transfer's setup: request type, request, value, index."""
Payload = bytes | bytearray | memoryview | int
"""What a transfer moves, as libusb and pyusb take it: an OUT transfer's bytes, or the length an
IN transfer asks for."""


class TransportBase(AsyncResource):
    """The part of a :class:`UsbTransport` every backend shares.

    A backend implements :meth:`_submit` (start one transfer with its library), :meth:`reset`
    and :meth:`aclose`, and reports how each transfer ended through :meth:`_result` (or, for an
    error it mapped itself, :meth:`_noted`). A transport is dead once closed, or once a transfer
    found no device (as a libusb handle is after an unplug: every later call fails with
    :class:`aio_runtime.DeviceLost` until the device is opened again). It is an
    :class:`aio_runtime.AsyncResource`: leaving ``async with transport:`` closes it.
    """

    def __init__(self, *, drain_timeout: float = 1.0) -> None:
        self.drain_timeout = drain_timeout
        self._closed = False
        self._lost = False

    def _check_open(self, awaited: str) -> None:
        if self._closed:
            raise DeviceLost(f"{awaited}: transport closed", layer=Layer.USB_TRANSFER)
        if self._lost:
            raise DeviceLost(
                f"{awaited}: the device went away; open it again", layer=Layer.USB_TRANSFER
            )

    def _check_request_type(self, is_in: bool, request_type: int, request: int) -> None:
        """A request type whose direction (bit 7) is the call's."""
        if bool(request_type & 0x80) != is_in:
            direction, other = ("IN", "OUT") if is_in else ("OUT", "IN")
            raise ValueError(f"control {direction} 0x{request:02x} with an {other} request type")

    def _start(
        self,
        awaited: str,
        timeout: float | None,
        endpoint: int,
        setup: Setup | None,
        payload: Payload,
    ) -> UsbTransfer[Any]:
        if self._closed or self._lost:
            self._check_open(awaited)
        bound = WaitBound(awaited=awaited, error=UsbTransferTimeout, timeout=timeout)
        return self._submit(bound, endpoint, setup, payload)

    @abc.abstractmethod
    def _submit(
        self, bound: WaitBound, endpoint: int, setup: Setup | None, payload: Payload
    ) -> UsbTransfer[Any]:
        """Start one transfer — a control transfer on endpoint 0 with ``setup``, or a bulk
        transfer on ``endpoint`` — bounded by ``bound`` (``bound.awaited`` names it), and return
        at once."""

    def _result(
        self,
        bound: WaitBound,
        payload: Payload,
        outcome: TransferOutcome,
        actual: int = 0,
        data: bytes = b"",
        detail: str = "",
    ) -> Any:
        """The result of a transfer that moved ``payload`` and ended as ``outcome``, or its typed
        error (:func:`outcome_result`)."""
        if outcome is TransferOutcome.NO_DEVICE:
            self._lost = True
        is_in = isinstance(payload, int)
        exact = payload if isinstance(payload, int) else len(payload)
        return outcome_result(
            outcome, actual, data, exact=exact, is_in=is_in, bound=bound, detail=detail
        )

    def _noted(self, error: BaseException) -> BaseException:
        """``error`` (already mapped), noting whether it says the device is gone."""
        if isinstance(error, DeviceLost):
            self._lost = True
        return error

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
        self._check_request_type(False, request_type, request)
        payload = bytes(data)
        awaited = describe_control(False, request, value, index, len(payload))
        setup = (request_type, request, value, index)
        await self._start(awaited, timeout, 0, setup, payload).wait()

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
        self._check_request_type(True, request_type, request)
        awaited = describe_control(True, request, value, index, length)
        setup = (request_type, request, value, index)
        result: bytes = await self._start(awaited, timeout, 0, setup, length).wait()
        return result

    def submit_bulk_out(
        self, endpoint: int, data: bytes | bytearray | memoryview, *, timeout: float | None = None
    ) -> UsbTransfer[None]:
        return self._start(describe_bulk(endpoint, len(data)), timeout, endpoint, None, data)

    async def bulk_out(
        self, endpoint: int, data: bytes | bytearray | memoryview, *, timeout: float | None = None
    ) -> None:
        await self.submit_bulk_out(endpoint, data, timeout=timeout).wait()

    async def bulk_in(self, endpoint: int, length: int, *, timeout: float | None = None) -> bytes:
        awaited = describe_bulk(endpoint, length)
        result: bytes = await self._start(awaited, timeout, endpoint, None, length).wait()
        return result

    @abc.abstractmethod
    async def reset(self, *, timeout: float | None = None) -> None:
        """Reset the device (a USB port reset): it forgets transfers in progress."""
