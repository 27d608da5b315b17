"""The simulated USB backend: transfers as URBs into a :class:`~transports.sim.bridge.SimBridge`.

In-process (the default) the bridge runs on the caller's event loop and, under virtual time, the
simulation is deterministic: its behaviour is a function of the loop clock and of its fault plan.
With ``call=`` (see :class:`transports.sim.SimServer`) the bridge runs on another thread's loop:
URBs are handed over with ``call`` and completions come back thread-safely. A transfer the device
never answers ends by its bound, like any other, as :class:`aio_runtime.UsbTransferTimeout`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aio_runtime import (
    Completion,
    DeviceLost,
    Layer,
    TransferError,
    UsbTransferTimeout,
    WaitBound,
    current_ledger,
    loop_caller,
)

from ..usb.base import (
    CONTROL_IN,
    CONTROL_OUT,
    UsbStall,
    UsbTransfer,
    describe_bulk,
    describe_control,
    require_length,
)
from .bridge import SimBridge
from .urb import SimUrb, UrbStatus

__all__ = ["SimUsbTransport"]

Call = Callable[..., object]


def _direct(fn: Callable[..., object], *args: Any) -> object:
    return fn(*args)


class SimUsbTransport:
    """A :class:`~transports.usb.UsbTransport` over a simulated bridge."""

    def __init__(self, bridge: SimBridge, *, call: Call | None = None) -> None:
        self.bridge = bridge
        self._call = call if call is not None else _direct
        self._threaded = call is not None
        self._closed = False
        self._lost = False

    def _submit(self, urb: SimUrb, timeout: float | None, *, exact: int) -> UsbTransfer[Any]:
        if urb.endpoint == 0:
            awaited = describe_control(urb.is_in, urb.request, urb.value, urb.index, urb.length)
        else:
            awaited = describe_bulk(urb.endpoint, urb.length if urb.is_in else len(urb.data))
        if self._closed:
            raise DeviceLost(f"{awaited}: transport closed", layer=Layer.USB_TRANSFER)
        if self._lost:
            raise DeviceLost(
                f"{awaited}: the device went away; open it again", layer=Layer.USB_TRANSFER
            )
        bound = WaitBound(awaited=awaited, error=UsbTransferTimeout, timeout=timeout)
        completion: Completion[SimUrb] = Completion()
        ledger = current_ledger()
        entry = ledger.open("usb transfer", awaited)

        def completed(done: SimUrb) -> None:
            ledger.close(entry)
            completion.set_result(done)

        if self._threaded:  # completions arrive on the simulation's thread
            to_loop = loop_caller()
            urb.on_complete = lambda done: to_loop(lambda: completed(done))
        else:
            urb.on_complete = completed

        def finish(done: SimUrb) -> Any:
            return self._outcome(done, awaited, exact)

        self._call(self.bridge.submit, urb)
        return UsbTransfer(
            awaited=awaited,
            bound=bound,
            completion=completion,
            cancel=lambda: self._call(self.bridge.discard, urb),
            finish=finish,
        )

    def _outcome(self, urb: SimUrb, awaited: str, exact: int) -> Any:
        if urb.status is UrbStatus.NO_DEVICE:
            self._lost = True  # like a libusb handle after an unplug: dead for good
            raise DeviceLost(f"{awaited}: no device", layer=Layer.USB_TRANSFER, awaited=awaited)
        if urb.status is UrbStatus.STALL:
            raise UsbStall(f"{awaited}: stall ({urb.error})", awaited=awaited)
        if urb.status is not UrbStatus.COMPLETED:
            raise TransferError(
                f"{awaited}: {urb.status.value if urb.status else 'not completed'}"
                + (f" ({urb.error})" if urb.error else ""),
                awaited=awaited,
                layer=Layer.USB_TRANSFER,
            )
        require_length(awaited, urb.actual, exact)
        return urb.result if urb.is_in else None

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
        if request_type != CONTROL_OUT:
            raise ValueError(
                f"control OUT 0x{request:02x}: the bridge takes vendor OUT requests (0x40)"
            )
        urb = SimUrb(0, request_type, request, value, index, data=bytes(data))
        await self._submit(urb, timeout, exact=len(data)).wait()

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
        if request_type != CONTROL_IN:
            raise ValueError(
                f"control IN 0x{request:02x}: the bridge takes vendor IN requests (0xC0)"
            )
        urb = SimUrb(0, request_type, request, value, index, length=length)
        result: bytes = await self._submit(urb, timeout, exact=length).wait()
        return result

    def submit_bulk_out(
        self, endpoint: int, data: bytes | bytearray | memoryview, *, timeout: float | None = None
    ) -> UsbTransfer[None]:
        return self._submit(SimUrb(endpoint, data=data), timeout, exact=len(data))

    async def bulk_out(
        self, endpoint: int, data: bytes | bytearray | memoryview, *, timeout: float | None = None
    ) -> None:
        await self.submit_bulk_out(endpoint, data, timeout=timeout).wait()

    async def bulk_in(self, endpoint: int, length: int, *, timeout: float | None = None) -> bytes:
        result: bytes = await self._submit(
            SimUrb(endpoint, length=length), timeout, exact=length
        ).wait()
        return result

    async def reset(self, *, timeout: float | None = None) -> None:
        """A USB port reset: the bridge cancels transfers in flight, drops arms and streams."""
        if self._closed or self._lost:
            raise DeviceLost("USB reset: the device is not open", layer=Layer.USB_TRANSFER)
        self._call(self.bridge.reset)

    async def aclose(self) -> None:
        self._closed = True
