"""The GPU device session over a USB-PCIe bridge: boot, memory, queues, copies, kernels, recovery."""

from ..errors import GpuFault
from .boot import BLOCKS
from .deps import DependencyFailed, DependencyTracker
from .session import Buffer, GpuSession, HostMapping, SessionConfig

__all__ = [
    "BLOCKS",
    "Buffer",
    "DependencyFailed",
    "DependencyTracker",
    "GpuFault",
    "GpuSession",
    "HostMapping",
    "SessionConfig",
]
