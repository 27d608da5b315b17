"""USB transports: one async interface for every backend, with bounded, typed transfers."""

from .backend import TransportBase
from .base import (
    CONTROL_IN,
    CONTROL_OUT,
    ShortTransfer,
    TransferOutcome,
    UsbStall,
    UsbTransfer,
    UsbTransport,
)

__all__ = [
    "CONTROL_IN",
    "CONTROL_OUT",
    "ShortTransfer",
    "TransferOutcome",
    "TransportBase",
    "UsbStall",
    "UsbTransfer",
    "UsbTransport",
]
