"""USB transports: one async interface for every backend, with bounded, typed transfers."""

from .base import (
    CONTROL_IN,
    CONTROL_OUT,
    ShortTransfer,
    UsbStall,
    UsbTransfer,
    UsbTransport,
)

__all__ = [
    "CONTROL_IN",
    "CONTROL_OUT",
    "ShortTransfer",
    "UsbStall",
    "UsbTransfer",
    "UsbTransport",
]
