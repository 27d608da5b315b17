"""The model on the simulated accelerator: inputs and outputs cross the copy protocol."""

from __future__ import annotations

import math

import numpy as np
import pytest

from aio_runtime import Layer, SignalTimeout
from aio_runtime.testing import virtual_time
from pipelines.dms.accelerator import AcceleratorRunner
from pipelines.dms.accelerator_sim import simulated_device
from transports.gpu.copy import CHUNK
from transports.sim import Fault, FaultRule
from transports.sim.usb import SimUsbTransport

pytestmark = pytest.mark.anyio

IMAGE, OUTPUT = 1382400, 553


def infer(img: np.ndarray, calib: np.ndarray) -> np.ndarray:
    """A stand-in model: the output depends on every input, so a wrong byte shows."""
    out = np.zeros((1, OUTPUT), dtype=np.float32)
    out[0, 0] = img.astype(np.float64).sum()
    out[0, 1:4] = calib[0]
    out[0, 4] = img[0, -1]
    return out


async def test_a_run_copies_in_runs_on_the_device_and_copies_out():
    rng = np.random.default_rng(1)
    img = rng.integers(0, 256, size=(1, IMAGE), dtype=np.uint8)
    calib = np.array([[0.1, -0.2, 0.3]], dtype=np.float32)
    async with simulated_device(infer, image_size=IMAGE, output_size=OUTPUT) as device:
        accelerator = await AcceleratorRunner.open(
            SimUsbTransport(device.bridge), image_size=IMAGE, output_size=OUTPUT
        )
        try:
            stats = accelerator.session.copy.stats
            before = (stats.bytes_in, stats.chunks_in, stats.bytes_out, stats.chunks_out)
            output, phases = await accelerator.run(img, calib, timeout=5.0)
            after = (stats.bytes_in, stats.chunks_in, stats.bytes_out, stats.chunks_out)
        finally:
            await accelerator.aclose()
    assert np.array_equal(output, infer(img, calib))
    crossed = tuple(b - a for a, b in zip(before, after, strict=True))
    assert crossed == (IMAGE + 12, math.ceil(IMAGE / CHUNK) + 1, OUTPUT * 4, 1)
    assert min(phases.copy_in, phases.device, phases.copy_out) > 0 and phases.submit >= 0


async def test_a_hung_device_is_a_gpu_queue_timeout_within_its_bound():
    img = np.zeros((1, IMAGE), dtype=np.uint8)
    calib = np.zeros((1, 3), dtype=np.float32)
    async with simulated_device(infer, image_size=IMAGE, output_size=OUTPUT) as device:
        accelerator = await AcceleratorRunner.open(
            SimUsbTransport(device.bridge), image_size=IMAGE, output_size=OUTPUT
        )
        try:
            device.plan.add(FaultRule(Fault.KERNEL_HANG, at=1))
            async with virtual_time():  # the model never runs here: no thread to outpace
                with pytest.raises(SignalTimeout) as info:
                    await accelerator.run(img, calib, timeout=0.05)
            assert info.value.layer is Layer.GPU_QUEUE
            await accelerator.session.recover()
            output, _ = await accelerator.run(img, calib, timeout=5.0)
            assert output.shape == (1, OUTPUT)
        finally:
            await accelerator.aclose()
