"""The simulated USB-PCIe bridge and GPU behind it (spec: hardware-waits §4 and §5), with a fault plan."""

from .bridge import SimBridge
from .faults import Fault, FaultPlan, FaultRule
from .urb import SimUrb, UrbStatus
from .usb import SimUsbTransport

__all__ = ["Fault", "FaultPlan", "FaultRule", "SimBridge", "SimUrb", "SimUsbTransport", "UrbStatus"]
