"""The in-process simulated backend: USB transfers straight into a :class:`SimBridge`.

Under virtual time this is deterministic: the bridge's behaviour is a function of the loop clock
and of its fault plan. A transfer the simulated device never answers ends by the transfer's bound
like any other, as :class:`aio_runtime.UsbTransferTimeout`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from aio_runtime import DeviceLost, Layer, UsbTransferTimeout, WaitBound

from ..sim.bridge import SimBridge, SimDeviceGone, SimTransferError
from .base import CONTROL_IN, CONTROL_OUT, ShortTransfer, UsbStall

__all__ = ["SimUsbTransport"]

T = TypeVar("T")


class SimUsbTransport:
    """A :class:`~transports.usb.UsbTransport` over a simulated bridge, in this process."""

    def __init__(self, bridge: SimBridge) -> None:
        self.bridge = bridge
        self._closed = False
        self._lost = False

    async def _transfer(
        self, step: Callable[[], Awaitable[T]], awaited: str, timeout: float | None
    ) -> T:
        if self._closed:
            raise DeviceLost(f"{awaited}: transport closed", layer=Layer.USB_TRANSFER)
        if self._lost:
            raise DeviceLost(
                f"{awaited}: the device went away; open it again", layer=Layer.USB_TRANSFER
            )
        bound = WaitBound(awaited=awaited, error=UsbTransferTimeout, timeout=timeout)
        try:
            return await bound.run(step(), awaited=awaited)
        except SimDeviceGone as exc:
            self._lost = True  # like a libusb handle after an unplug: dead for good
            raise DeviceLost(
                f"{awaited}: no device", layer=Layer.USB_TRANSFER, awaited=awaited
            ) from exc
        except SimTransferError as exc:
            raise UsbStall(f"{awaited}: stall ({exc})", awaited=awaited) from exc

    @staticmethod
    def _exact(data: bytes, length: int, awaited: str) -> bytes:
        if len(data) != length:
            raise ShortTransfer(
                f"{awaited}: {len(data)} of {length} bytes",
                expected=length,
                actual=len(data),
                awaited=awaited,
            )
        return data

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
        awaited = f"control OUT 0x{request:02x} (value 0x{value:x}, index 0x{index:x})"
        if request_type != CONTROL_OUT:
            raise ValueError(f"{awaited}: the bridge takes vendor OUT requests (0x40)")
        written = await self._transfer(
            lambda: self.bridge.control_out(request, value, index, bytes(data)), awaited, timeout
        )
        if written != len(data):
            raise ShortTransfer(
                f"{awaited}: {written} of {len(data)} bytes",
                expected=len(data),
                actual=written,
                awaited=awaited,
            )

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
        awaited = f"control IN 0x{request:02x} (value 0x{value:x}, {length} bytes)"
        if request_type != CONTROL_IN:
            raise ValueError(f"{awaited}: the bridge takes vendor IN requests (0xC0)")
        data = await self._transfer(
            lambda: self.bridge.control_in(request, value, index, length), awaited, timeout
        )
        return self._exact(data, length, awaited)

    async def bulk_out(self, endpoint: int, data: bytes, *, timeout: float | None = None) -> None:
        awaited = f"bulk OUT ep 0x{endpoint:02x} ({len(data)} bytes)"
        written = await self._transfer(
            lambda: self.bridge.bulk_out(endpoint, bytes(data)), awaited, timeout
        )
        if written != len(data):
            raise ShortTransfer(
                f"{awaited}: {written} of {len(data)} bytes",
                expected=len(data),
                actual=written,
                awaited=awaited,
            )

    async def bulk_in(self, endpoint: int, length: int, *, timeout: float | None = None) -> bytes:
        awaited = f"bulk IN ep 0x{endpoint:02x} ({length} bytes)"
        data = await self._transfer(lambda: self.bridge.bulk_in(endpoint, length), awaited, timeout)
        return self._exact(data, length, awaited)

    async def reset(self, *, timeout: float | None = None) -> None:
        """A USB port reset: the bridge drops armed transfers and pending streams."""
        await self._transfer(_async(self.bridge.reset), "USB reset", timeout)

    async def aclose(self) -> None:
        self._closed = True


def _async(fn: Callable[[], None]) -> Callable[[], Awaitable[None]]:
    async def call() -> None:
        fn()

    return call
