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
    LedgerKind,
    WaitBound,
    current_ledger,
    loop_caller,
)

from ..usb.backend import Payload, Setup, TransportBase
from ..usb.base import (
    CONTROL_IN,
    CONTROL_OUT,
    TransferOutcome,
    UsbTransfer,
)
from .bridge import SimBridge
from .urb import SimUrb, UrbStatus

__all__ = ["SimUsbTransport"]

Call = Callable[..., object]

_OUTCOMES = {
    UrbStatus.COMPLETED: TransferOutcome.COMPLETED,
    UrbStatus.STALL: TransferOutcome.STALL,
    UrbStatus.NO_DEVICE: TransferOutcome.NO_DEVICE,
    UrbStatus.CANCELLED: TransferOutcome.CANCELLED,
}


def _direct(fn: Callable[..., object], *args: Any) -> object:
    return fn(*args)


class SimUsbTransport(TransportBase):
    """A :class:`~transports.usb.UsbTransport` over a simulated bridge. It takes the bridge's
    vendor requests only (request types 0x40 and 0xC0)."""

    def __init__(self, bridge: SimBridge, *, call: Call | None = None) -> None:
        super().__init__()
        self.bridge = bridge
        self._call = call if call is not None else _direct
        self._threaded = call is not None

    def _check_request_type(self, is_in: bool, request_type: int, request: int) -> None:
        expected = CONTROL_IN if is_in else CONTROL_OUT
        if request_type != expected:
            direction = "IN" if is_in else "OUT"
            raise ValueError(
                f"control {direction} 0x{request:02x}: the bridge takes vendor {direction} "
                f"requests (0x{expected:02X})"
            )

    def _submit(
        self, bound: WaitBound, endpoint: int, setup: Setup | None, payload: Payload
    ) -> UsbTransfer[Any]:
        data, length = (b"", payload) if isinstance(payload, int) else (payload, 0)
        if setup is None:
            urb = SimUrb(endpoint, data=data, length=length)
        else:
            request_type, request, value, index = setup
            urb = SimUrb(endpoint, request_type, request, value, index, data=data, length=length)
        completion: Completion[SimUrb] = Completion()
        ledger = current_ledger()
        entry = ledger.open(LedgerKind.USB_TRANSFER, bound.awaited)

        def completed(done: SimUrb) -> None:
            ledger.close(entry)
            completion.set_result(done)

        if self._threaded:  # completions arrive on the simulation's thread
            to_loop = loop_caller()
            urb.on_complete = lambda done: to_loop(lambda: completed(done))
        else:
            urb.on_complete = completed

        def finish(done: SimUrb) -> Any:
            outcome = _OUTCOMES.get(done.status) if done.status else None
            if outcome is None:
                return self._result(bound, payload, TransferOutcome.ERROR, detail="not completed")
            return self._result(bound, payload, outcome, done.actual, done.result, done.error)

        try:
            self._call(self.bridge.submit, urb)
        except RuntimeError as exc:  # a threaded simulation that is no longer running
            ledger.close(entry)
            raise DeviceLost(f"{bound.awaited}: {exc}", layer=Layer.USB_TRANSFER) from exc
        return UsbTransfer(
            awaited=bound.awaited,
            bound=bound,
            completion=completion,
            cancel=lambda: self._call(self.bridge.discard, urb),
            finish=finish,
        )

    async def reset(self, *, timeout: float | None = None) -> None:
        """A USB port reset: the bridge cancels transfers in flight, drops arms and streams."""
        if self._closed or self._lost:
            raise DeviceLost("USB reset: the device is not open", layer=Layer.USB_TRANSFER)
        self._call(self.bridge.reset)

    async def aclose(self) -> None:
        self._closed = True
