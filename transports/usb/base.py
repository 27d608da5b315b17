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

Every backend translates its library's status into a :class:`TransferOutcome`, and
:func:`outcome_result` maps that onto the typed family, the same for all. What else the backends
share is :class:`~transports.usb.backend.TransportBase`.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar

from aio_runtime import (
    Completion,
    DeviceLost,
    Layer,
    TransferError,
    WaitBound,
    completed_at_once,
    drain,
    wait_complete,
)

__all__ = [
    "CONTROL_IN",
    "CONTROL_OUT",
    "ShortTransfer",
    "TransferOutcome",
    "UsbStall",
    "UsbTransfer",
    "UsbTransport",
    "describe_bulk",
    "describe_control",
    "library_timeout_ms",
    "outcome_result",
    "require_length",
    "transfer_error",
]

T = TypeVar("T")

CONTROL_OUT = 0x40
"""bmRequestType of a vendor request to the device."""
CONTROL_IN = 0xC0
"""bmRequestType of a vendor request from the device."""


def describe_control(is_in: bool, request: int, value: int, index: int, length: int) -> str:
    """How every backend names a vendor request in errors (``awaited``)."""
    if is_in:
        return f"control IN 0x{request:02x} (value 0x{value:x}, {length} bytes)"
    return f"control OUT 0x{request:02x} (value 0x{value:x}, index 0x{index:x})"


def describe_bulk(endpoint: int, size: int) -> str:
    """How every backend names a bulk transfer in errors (``awaited``)."""
    return f"bulk {'IN' if endpoint & 0x80 else 'OUT'} ep 0x{endpoint:02x} ({size} bytes)"


def library_timeout_ms(remaining: float) -> int:
    """A USB library's timeout for a transfer with ``remaining`` seconds left: whole milliseconds,
    rounded up, and at least 1 — libusb and pyusb read 0 as "wait forever"."""
    return max(1, math.ceil(round(remaining * 1000.0, 6)))  # (round: 1.1 s is 1100 ms, not 1101)


class UsbStall(TransferError):
    """The device stalled the endpoint: it refused the request."""


class ShortTransfer(TransferError):
    """A transfer moved fewer bytes than the protocol requires."""

    def __init__(self, message: str, *, expected: int, actual: int, awaited: str = "") -> None:
        super().__init__(message, awaited=awaited)
        self.expected = expected
        self.actual = actual


def require_length(awaited: str, actual: int, expected: int) -> None:
    """Every backend's rule: a transfer moves exactly the bytes asked for, else
    :class:`ShortTransfer`."""
    if actual != expected:
        raise ShortTransfer(
            f"{awaited}: {actual} of {expected} bytes",
            expected=expected,
            actual=actual,
            awaited=awaited,
        )


class TransferOutcome(enum.Enum):
    """How a transfer ended, in every backend's terms: each translates its library's status into
    one of these, and :func:`outcome_result` maps it onto the typed family."""

    COMPLETED = "completed"
    TIMED_OUT = "timed out"
    """The library's own timeout: the wait's bound (:meth:`aio_runtime.WaitBound.timed_out`)."""
    STALL = "stall"
    NO_DEVICE = "no device"
    CANCELLED = "cancelled"
    ERROR = "error"
    """Anything else; the detail says what."""


def transfer_error(outcome: TransferOutcome, bound: WaitBound, detail: str = "") -> Exception:
    """The typed error of a transfer that did not complete (``bound`` names it and says which
    bound a timeout was: :class:`aio_runtime.UsbTransferTimeout` or, when an enclosing scope was
    the earlier one, :class:`aio_runtime.BudgetExhausted`). ``detail`` is what the library said;
    for ``ERROR`` it is the whole description."""
    awaited = bound.awaited
    if outcome is TransferOutcome.TIMED_OUT:
        return bound.timed_out()
    if outcome is TransferOutcome.NO_DEVICE:
        return DeviceLost(f"{awaited}: no device", layer=Layer.USB_TRANSFER, awaited=awaited)
    said = f" ({detail})" if detail else ""
    if outcome is TransferOutcome.STALL:
        return UsbStall(f"{awaited}: stall{said}", awaited=awaited)
    text = f"cancelled{said}" if outcome is TransferOutcome.CANCELLED else detail or "error"
    return TransferError(f"{awaited}: {text}", awaited=awaited, layer=Layer.USB_TRANSFER)


def outcome_result(
    outcome: TransferOutcome,
    actual: int,
    data: bytes,
    *,
    exact: int,
    is_in: bool,
    bound: WaitBound,
    detail: str = "",
) -> bytes | None:
    """A finished transfer's result — IN data, or None — or its typed error
    (:func:`transfer_error`). A completed transfer must move exactly ``exact`` bytes, else
    :class:`ShortTransfer`."""
    if outcome is TransferOutcome.COMPLETED:
        require_length(bound.awaited, actual, exact)
        return data if is_in else None
    raise transfer_error(outcome, bound, detail)


class UsbTransfer(Generic[T]):
    """A submitted transfer. :meth:`wait` returns its result or raises its typed error.

    Its bound is taken when it is submitted (its own timeout, or the enclosing deadline then),
    as libusb's per-transfer timeout is. When the wait ends without the completion (a timeout, a
    cancelled task) the transfer is cancelled and its completion awaited — shielded, for at most
    ``drain_timeout`` — before the error propagates, so the caller owns the buffer again.
    :meth:`cancel` does the same for a transfer nobody is waiting on. Backends build these.
    """

    def __init__(
        self,
        *,
        awaited: str,
        bound: WaitBound,
        completion: Completion[Any],
        cancel: Callable[[], object],
        finish: Callable[[Any], T],
        drain_timeout: float = 1.0,
    ) -> None:
        self.awaited = awaited
        self._bound = bound
        self._completion = completion
        self._cancel = cancel
        self._finish = finish
        self._drain_timeout = drain_timeout

    def done(self) -> bool:
        return self._completion.done()

    async def wait(self) -> T:
        if self._completion.done():  # finished already: its outcome, with no bound to watch
            await completed_at_once()
            return self._finish(self._completion.result())
        raw = await wait_complete(
            self._completion,
            awaited=self.awaited,
            within=self._bound,
            cancel=self._cancel,
            drain_timeout=self._drain_timeout,
        )
        return self._finish(raw)

    async def cancel(self) -> None:
        """Cancel the transfer (if still in flight) and await its completion, shielded and
        bounded by ``drain_timeout``; its outcome is dropped."""
        await drain(self._completion, self._cancel, limit=self._drain_timeout)


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

    async def bulk_out(
        self, endpoint: int, data: bytes | bytearray | memoryview, *, timeout: float | None = None
    ) -> None:
        """All of ``data``, or :class:`ShortTransfer`."""
        ...

    async def bulk_in(self, endpoint: int, length: int, *, timeout: float | None = None) -> bytes:
        """Exactly ``length`` bytes, or :class:`ShortTransfer`."""
        ...

    def submit_bulk_out(
        self, endpoint: int, data: bytes | bytearray | memoryview, *, timeout: float | None = None
    ) -> UsbTransfer[None]:
        """Start a bulk OUT and return at once; transfers on one endpoint complete in the order
        they were submitted. ``data`` must not change until the transfer has completed."""
        ...

    async def reset(self, *, timeout: float | None = None) -> None:
        """Reset the device (a USB port reset): it forgets transfers in progress."""
        ...

    async def aclose(self) -> None: ...
