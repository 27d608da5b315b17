"""USB request blocks: how a host's transfers reach the simulated device.

A backend (in-process, or the umockdev ioctl handler) turns every transfer into one :class:`SimUrb`,
hands it to the device with ``submit`` and learns the outcome through ``on_complete``, called once
with the URB's ``status``, ``actual`` length and (for IN transfers) ``result``. A URB the device
never completes ends only when the host discards it (``discard``: status ``CANCELLED``), as a
usbfs URB does. Both calls, and the completion callback, run on the thread that runs the
simulation's event loop.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["SimUrb", "UrbStatus"]


class UrbStatus(enum.Enum):
    # Members are singletons: hash by identity (C-level), not by name (every transfer maps one).
    __hash__ = object.__hash__

    COMPLETED = "completed"
    STALL = "stall"
    """The device refused the request (malformed, or not what the protocol expects now)."""
    NO_DEVICE = "no device"
    CANCELLED = "cancelled"


@dataclass(eq=False)
class SimUrb:
    """One transfer. ``endpoint`` 0 is the control endpoint (its direction is bit 7 of
    ``request_type``); bulk endpoints carry their direction in bit 7 of the address."""

    endpoint: int
    request_type: int = 0
    request: int = 0
    value: int = 0
    index: int = 0
    data: bytes | bytearray | memoryview = b""
    """The payload of an OUT transfer."""
    length: int = 0
    """The length asked for by an IN transfer."""
    on_complete: Callable[[SimUrb], object] | None = field(default=None, repr=False)
    status: UrbStatus | None = None
    actual: int = 0
    result: bytes = b""
    error: str = ""

    @property
    def is_in(self) -> bool:
        return bool((self.request_type if self.endpoint == 0 else self.endpoint) & 0x80)

    @property
    def done(self) -> bool:
        return self.status is not None

    def complete(
        self, status: UrbStatus, *, actual: int = 0, result: bytes = b"", error: str = ""
    ) -> None:
        """Finish the URB once; a second completion is ignored (the first outcome stands)."""
        if self.status is not None:
            return
        self.status, self.actual, self.result, self.error = status, actual, result, error
        # Called once, then let go: a callback that keeps the URB (through the completion it
        # sets) would otherwise make a reference cycle of every transfer, freed only by the
        # garbage collector's full passes, which then run often and long.
        callback, self.on_complete = self.on_complete, None
        if callback is not None:
            callback(self)
