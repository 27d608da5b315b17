"""A simulated accelerator that can run the DMS model: the simulator's GPU with the model as its
kernel :data:`~pipelines.dms.accelerator.MODEL_KERNEL`.

The kernel reads its inputs from VRAM, runs ``infer`` (onnxruntime) in a worker thread — off the
event loop, as a real device would run off the host's CPU — and writes the output back to VRAM. So
inputs and outputs really cross the bridge (``session.copy.stats`` counts the bytes and chunks).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable

import anyio.to_thread
import numpy as np

from transports.sim import FaultPlan
from transports.sim.gpu import SimDevice, SimGpu

from .accelerator import MODEL_KERNEL

__all__ = ["Infer", "model_kernel", "simulated_device"]

Infer = Callable[[np.ndarray, np.ndarray], np.ndarray]
"""``infer(img (1, N) uint8, calib (1, 3) float32) -> output (1, M) float32`` (blocking)."""


def model_kernel(infer: Infer, image_size: int, output_size: int) -> Callable[..., object]:
    """The model as a kernel of the simulated GPU (register it as :data:`MODEL_KERNEL`)."""

    async def kernel(gpu: SimGpu, image: int, calib: int, output: int) -> None:
        img = gpu.view(image, image_size).copy().reshape(1, image_size)
        cal = gpu.view(calib, 12).copy().view(np.float32).reshape(1, 3)
        result = await anyio.to_thread.run_sync(infer, img, cal)
        flat = np.ascontiguousarray(result, dtype=np.float32).reshape(-1)
        if flat.size != output_size:
            raise ValueError(f"the model produced {flat.size} values, expected {output_size}")
        gpu.view(output, output_size * 4)[:] = flat.view(np.uint8)

    return kernel


@contextlib.asynccontextmanager
async def simulated_device(
    infer: Infer, *, image_size: int, output_size: int, plan: FaultPlan | None = None
) -> AsyncIterator[SimDevice]:
    """A simulated bridge + GPU on this loop whose GPU can run the model."""
    async with SimDevice(plan=plan) as device:
        device.gpu.register_kernel(MODEL_KERNEL, model_kernel(infer, image_size, output_size))
        yield device
