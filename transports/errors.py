"""Errors of the transports that are not the core's: what a GPU reports about itself."""

from __future__ import annotations

from aio_runtime import Layer, RuntimeFault

__all__ = ["GpuFault"]


class GpuFault(RuntimeFault):
    """The GPU stopped: a queue halted (the copy engine's watchdog), the device entered its error
    state (an interrupt: page fault, shader error), or work was lost to a device recovery.
    ``source`` names the interrupt, when there is one."""

    default_layer = Layer.GPU_QUEUE

    def __init__(self, message: str, *, source: int = 0, awaited: str = "") -> None:
        super().__init__(message, awaited=awaited)
        self.source = source
