"""The simulated USB-PCIe bridge and GPU behind it (spec: hardware-waits §4 and §5), with a fault plan."""

from .faults import Fault, FaultPlan, FaultRule

__all__ = ["Fault", "FaultPlan", "FaultRule"]
