"""The model on the simulated accelerator: a GPU behind a USB-PCIe bridge, through ``transports``.

Per frame: copy the inputs in (the warped image and the calibration, through the copy protocol),
run the model as a device kernel, await the compute timeline within the frame's deadline, copy the
output out — each phase timed on its own (:class:`PhaseTimes`). Buffers are allocated once per
session; the output is copied out into a fresh array, so nothing the caller keeps is reused by the
next frame.

The simulated GPU runs the model as a registered kernel: it reads its inputs from VRAM, runs
``infer`` (onnxruntime) in a worker thread — off the event loop, as a real device would run off the
host's CPU — and writes the output back to VRAM. So inputs and outputs really cross the bridge
(``session.copy.stats`` counts the bytes and chunks).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import anyio
import anyio.to_thread
import numpy as np

from aio_runtime import Readiness, now
from transports.gpu import Buffer, GpuSession, SessionConfig
from transports.sim import FaultPlan
from transports.sim.gpu import SimDevice, SimGpu
from transports.sim.usb import SimUsbTransport

__all__ = ["MODEL_KERNEL", "PhaseTimes", "SimAccelerator", "simulated_device"]

MODEL_KERNEL = 0x100
Infer = Callable[[np.ndarray, np.ndarray], np.ndarray]
"""``infer(img (1, N) uint8, calib (1, 3) float32) -> output (1, M) float32`` (blocking)."""


@dataclass(frozen=True)
class PhaseTimes:
    """Seconds spent in each phase of one run."""

    copy_in: float
    submit: float
    device: float
    copy_out: float

    @property
    def total(self) -> float:
        return self.copy_in + self.submit + self.device + self.copy_out


def _model_kernel(infer: Infer, image_size: int, output_size: int) -> Callable[..., object]:
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
    """A simulated bridge + GPU on this loop whose GPU can run the model (kernel
    :data:`MODEL_KERNEL`)."""
    async with SimDevice(plan=plan) as device:
        device.gpu.register_kernel(MODEL_KERNEL, _model_kernel(infer, image_size, output_size))
        yield device


class SimAccelerator:
    """One open session on the simulated accelerator, ready to run the model."""

    def __init__(self, session: GpuSession, *, image_size: int, output_size: int) -> None:
        self.session = session
        self.image_size = image_size
        self.output_size = output_size
        self._buffers: tuple[Buffer, Buffer, Buffer] | None = None
        self._owed_since: float | None = None
        """Since when (loop clock) the device owes a run it has not finished: None when idle."""
        self._progress_at = 0.0
        """When the device last finished a step (a copy, a kernel)."""

    @classmethod
    async def open(
        cls,
        device: SimDevice,
        *,
        image_size: int,
        output_size: int,
        config: SessionConfig | None = None,
        readiness: Readiness | None = None,
    ) -> SimAccelerator:
        session = await GpuSession.open(
            SimUsbTransport(device.bridge), config=config, readiness=readiness
        )
        accelerator = cls(session, image_size=image_size, output_size=output_size)
        try:
            accelerator._buffers = (
                await session.alloc(image_size),
                await session.alloc(16),
                await session.alloc(output_size * 4),
            )
        except BaseException:
            with anyio.CancelScope(shield=True):
                await session.aclose()
            raise
        return accelerator

    async def run(
        self, image: np.ndarray, calib: np.ndarray, *, timeout: float
    ) -> tuple[np.ndarray, PhaseTimes]:
        """Run the model once; ``timeout`` bounds the device's part (the enclosing deadline
        scope bounds everything)."""
        assert self._buffers is not None
        image_buffer, calib_buffer, output_buffer = self._buffers
        img = np.ascontiguousarray(image, dtype=np.uint8).reshape(-1)
        if img.size != self.image_size:
            raise ValueError(f"the model takes {self.image_size} image bytes, got {img.size}")
        cal = np.ascontiguousarray(calib, dtype=np.float32).reshape(-1)
        if cal.size != 3:
            raise ValueError(f"the model takes a 3-value calibration, got {cal.size}")
        if self._owed_since is None:
            self._owed_since = now()
        start = time.perf_counter()
        await self.session.copy_in(image_buffer, img)  # after any kernel still reading it
        self._progressed()
        await self.session.copy_in(calib_buffer, cal)
        self._progressed()
        copied = time.perf_counter()
        submitted = [copied]
        await self.session.run_kernel(
            MODEL_KERNEL,
            [image_buffer, calib_buffer, output_buffer],
            reads=[image_buffer, calib_buffer],
            writes=[output_buffer],
            timeout=timeout,
            on_submitted=lambda: submitted.__setitem__(0, time.perf_counter()),
        )
        self._progressed()
        done = time.perf_counter()
        raw = await self.session.copy_out(output_buffer)
        self._progressed()
        self._owed_since = None
        finished = time.perf_counter()
        output = np.frombuffer(bytes(raw), dtype=np.float32).reshape(1, self.output_size)
        phases = PhaseTimes(
            copied - start, submitted[0] - copied, done - submitted[0], finished - done
        )
        return output, phases

    def _progressed(self) -> None:
        self._progress_at = now()

    async def stalled_for(self, *, timeout: float) -> float:
        """Seconds the device has owed a run without finishing any step of it (a copy, the
        kernel): how a hung device — a kernel that never completes, a copy fence or a USB
        transfer that never does — is told from a slow one, whose runs overrun the frame's budget
        but keep finishing steps (0 when nothing is owed). A kernel whose frame stopped waiting
        for it is checked on the device (one timeline read, bounded by ``timeout``: a read that
        does not finish is no progress). Raises what reading the device raises (a lost device)."""
        owed = self._owed_since
        if owed is None:
            return 0.0
        with anyio.move_on_after(timeout):
            if await self.session.retire_finished():
                self._progressed()
        return now() - max(owed, self._progress_at)

    async def aclose(self) -> None:
        await self.session.aclose()
