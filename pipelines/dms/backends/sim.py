"""The accelerator as a device kind (:func:`open_device`: over the USB transports given, or
simulated in this process), and the simulated accelerator that can run the DMS model: the
simulator's GPU with the model as its kernel
:data:`~pipelines.dms.backends.accelerator.MODEL_KERNEL`.

The kernel reads its inputs from VRAM, runs ``infer`` (onnxruntime) on a worker thread of its own
— off the event loop, as a real device would run off the host's CPU — and writes the output back
to VRAM. So inputs and outputs really cross the bridge (``session.copy.stats`` counts the bytes
and chunks).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import numpy as np

from aio_runtime import (
    Completion,
    LedgerKind,
    ModelTimeout,
    WorkerThread,
    current_ledger,
    run_in_thread,
)
from transports.sim import FaultPlan
from transports.sim.gpu import SimDevice, SimGpu
from transports.sim.usb import SimUsbTransport
from transports.usb import UsbTransport

from ..config.settings import ServiceConfig
from ..model.contract import ModelContract
from ..model.warp import MODEL_INPUT_SIZE
from .accelerator import MODEL_KERNEL, open_accelerator
from .base import Device
from .cpu import OnnxRunner
from .link import TransportOpener

__all__ = ["Infer", "model_kernel", "open_device", "simulated_device"]

Infer = Callable[[np.ndarray, np.ndarray], np.ndarray]
"""``infer(img (1, N) uint8, calib (1, 3) float32) -> output (1, M) float32`` (blocking)."""


def model_kernel(
    infer: Infer, image_size: int, output_size: int, worker: WorkerThread | None = None
) -> Callable[..., object]:
    """The model as a kernel of the simulated GPU (register it as :data:`MODEL_KERNEL`):
    ``infer`` runs on ``worker`` (default: a worker of the kernel's own, started on its first
    run). It reads the inputs where they lie in VRAM — the queues order every copy into those
    bytes after the kernel, and a kernel abandoned by a queue reset writes nothing back — and
    the call is in the ledger (a worker thread) until it returns."""
    thread = worker or WorkerThread("simulated GPU: model kernel")

    async def kernel(gpu: SimGpu, image: int, calib: int, output: int) -> None:
        img = gpu.view(image, image_size).reshape(1, image_size)
        cal = gpu.view(calib, 12).view(np.float32).reshape(1, 3)
        done: Completion[np.ndarray] = Completion()
        setter = done.threadsafe_setter()
        ledger = current_ledger()
        entry = ledger.open(LedgerKind.WORKER_THREAD, "the simulated GPU's model kernel")

        def work() -> None:
            try:
                result = infer(img, cal)
            except BaseException as exc:  # the kernel fails on the device, not on the thread
                ledger.close(entry)
                setter.set_exception(exc)
            else:
                ledger.close(entry)
                setter.set_result(result)

        thread.submit(work)
        flat = np.ascontiguousarray(await done.wait(), dtype=np.float32).reshape(-1)
        if flat.size != output_size:
            raise ValueError(f"the model produced {flat.size} values, expected {output_size}")
        gpu.view(output, output_size * 4)[:] = flat.view(np.uint8)

    return kernel


@contextlib.asynccontextmanager
async def simulated_device(
    infer: Infer, *, image_size: int, output_size: int, plan: FaultPlan | None = None
) -> AsyncIterator[SimDevice]:
    """A simulated bridge + GPU on this loop whose GPU can run the model (on a worker thread of
    its own, ended with the device)."""
    worker = WorkerThread("simulated GPU: model kernel")
    try:
        async with SimDevice(plan=plan) as device:
            device.gpu.register_kernel(
                MODEL_KERNEL, model_kernel(infer, image_size, output_size, worker)
            )
            yield device
    finally:
        worker.close()


@contextlib.asynccontextmanager
async def open_device(
    config: ServiceConfig,
    path: Path,
    contract: ModelContract,
    *,
    plan: FaultPlan | None = None,
    transport: TransportOpener | None = None,
    model_cpus: frozenset[int] | None = None,
) -> AsyncIterator[Device]:
    """The accelerator, over the USB transports ``transport`` opens; without one, simulated in
    this process, its faults scripted by ``plan``. ``model_cpus`` is the CPU runner's (unused)."""
    if transport is not None:
        async with open_accelerator(config, contract, transport) as device:
            yield device
        return
    async with (
        _in_process(config, path, contract, plan or FaultPlan()) as in_process,
        open_accelerator(config, contract, in_process) as device,
    ):
        yield device


@contextlib.asynccontextmanager
async def _in_process(
    config: ServiceConfig, path: Path, contract: ModelContract, plan: FaultPlan
) -> AsyncIterator[TransportOpener]:
    """A simulated accelerator in this process: its GPU runs the model as its kernel (on a
    thread); yields how to reach it."""
    kernel = await run_in_thread(
        lambda: OnnxRunner(path, intra_op_threads=config.intra_op_threads, contract=contract),
        awaited=f"loading model {path.name}",
        error=ModelTimeout,
        timeout=config.model_load_timeout,
    )
    try:
        async with simulated_device(
            kernel.run_blocking,
            image_size=MODEL_INPUT_SIZE,
            output_size=contract.output_length,
            plan=plan,
        ) as simulated:

            async def in_process() -> UsbTransport:
                return SimUsbTransport(simulated.bridge)

            yield in_process
    finally:
        kernel.close()
