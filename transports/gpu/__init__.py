"""The GPU device session over a USB-PCIe bridge: boot, memory, queues, copies, kernels, recovery."""

from ..errors import GpuFault
from .boot import BLOCKS, bridge_answers
from .config import SessionConfig
from .deps import DependencyFailed, DependencyTracker
from .session import Buffer, GpuSession, HostMapping

__all__ = [
    "BLOCKS",
    "Buffer",
    "DependencyFailed",
    "DependencyTracker",
    "GpuFault",
    "GpuSession",
    "HostMapping",
    "SessionConfig",
    "bridge_answers",
]
