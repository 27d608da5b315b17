"""The model's backends: one protocol (:class:`ModelBackend`), two implementations — onnxruntime on
the CPU (:class:`CpuBackend`) and an accelerator session over any USB transport
(:class:`AcceleratorBackend`) — and :func:`open_device`, the one place that reads the device kind.

The accelerator's sessions can fail; its :class:`Device` has a probe (does the bridge answer?) by
which its supervisor reopens it as soon as it is back (:mod:`.link`), and a session
that failed on a device that no longer answers is abandoned rather than closed: its close would
only wait out the bounds of transfers nobody answers.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple, Protocol

import numpy as np

from aio_runtime import (
    ModelTimeout,
    Readiness,
    ReadinessLayer,
    deadline_scope,
    run_in_thread,
)
from transports.gpu import SessionConfig
from transports.sim import FaultPlan
from transports.sim.usb import SimUsbTransport
from transports.usb import UsbTransport

from ..config.kinds import DeviceKind
from ..config.settings import ServiceConfig
from ..model.contract import ModelContract, load_contract
from ..model.reference import reference_model_path
from ..model.warp import MODEL_INPUT_SIZE
from .accelerator import AcceleratorRunner
from .cpu import OnnxRunner
from .link import AcceleratorLink, LentTransport, TransportOpener
from .sim import simulated_device

__all__ = [
    "AcceleratorBackend",
    "CpuBackend",
    "Device",
    "Inference",
    "ModelBackend",
    "TransportOpener",
    "open_device",
    "simulator_plan",
]


class Inference(NamedTuple):
    output: np.ndarray
    """The model's output, flat float32: the caller's to keep."""
    device_time: float
    """Seconds the device spent on the run."""


class ModelBackend(Protocol):
    """Runs the model on one frame at a time, within the caller's deadline scope."""

    @property
    def runs_back_to_back(self) -> bool:
        """A run may be asked for while another is in progress: it starts the moment that one
        returns (and a newer run may supersede it while it waits: ``RunSuperseded``)."""
        ...

    async def infer(self, image: np.ndarray, calib: np.ndarray) -> Inference:
        """Run the model on a warped image (uint8, handed over: unchanged until this returns)
        and a (1, 3) float32 calibration. Raises the runtime's typed errors."""
        ...

    async def aclose(self) -> None: ...


class CpuBackend:
    """onnxruntime on the CPU: runs follow each other on the runner's thread."""

    runs_back_to_back = True

    def __init__(self, runner: OnnxRunner) -> None:
        self.runner = runner

    async def infer(self, image: np.ndarray, calib: np.ndarray) -> Inference:
        start = time.perf_counter()
        output = await self.runner.run(image, calib, handed_over=True, replace_waiting=True)
        return Inference(output, time.perf_counter() - start)

    async def aclose(self) -> None:
        """Nothing: the runner belongs to the device, which closes it."""


class AcceleratorBackend:
    """An accelerator session: one run at a time; a run that makes no progress for
    ``kernel_timeout`` (the hang bound) ends hung (:meth:`AcceleratorRunner.run
    <pipelines.dms.backends.accelerator.AcceleratorRunner.run>`)."""

    runs_back_to_back = False

    def __init__(self, runner: AcceleratorRunner, *, kernel_timeout: float) -> None:
        self.runner = runner
        self.kernel_timeout = kernel_timeout

    async def infer(self, image: np.ndarray, calib: np.ndarray) -> Inference:
        output, phases = await self.runner.run(image, calib, timeout=self.kernel_timeout)
        return Inference(output.reshape(-1), phases.device)

    async def aclose(self) -> None:
        await self.runner.aclose()


SessionOpener = Callable[[Readiness], AbstractAsyncContextManager[ModelBackend]]
"""Opens a session on the device, marking its readiness layers as it comes up."""


@dataclass(frozen=True)
class Device:
    """A device, open for the model: what its sessions are called, the model's contract, how to
    open a session."""

    name: str
    """``accelerator`` or ``cpu``: in reasons and logs."""
    contract: ModelContract
    open_session: SessionOpener
    restartable: bool
    """A session that fails is torn down and opened again (the accelerator); otherwise a fault
    is each frame's own (a CPU runner has no session to lose)."""
    probe: Callable[[], Awaitable[bool | None]] | None = None
    """Whether the device answers at all, or None for no news (a cheap check, for the
    supervisor of a restartable device: see :class:`aio_runtime.Supervisor`); None: it has
    none."""


def simulator_plan(
    config: ServiceConfig, transport: TransportOpener | None = None
) -> FaultPlan | None:
    """The fault plan of the simulated accelerator :func:`open_device` will run in this process,
    if it will (None otherwise); :class:`ValueError` for a transport the device cannot use."""
    if config.device is DeviceKind.CPU and transport is not None:
        raise ValueError("a USB transport is for the accelerator (device 'sim'), not the CPU")
    return FaultPlan() if config.device is DeviceKind.SIM and transport is None else None


@contextlib.asynccontextmanager
async def open_device(
    config: ServiceConfig,
    *,
    plan: FaultPlan | None = None,
    transport: TransportOpener | None = None,
    model_cpus: frozenset[int] | None = None,
) -> AsyncIterator[Device]:
    """Load the model and open ``config.device`` for it. ``transport``: the accelerator's USB
    transports (default: a simulated accelerator in this process, its faults scripted by
    ``plan``, see :func:`simulator_plan`); ``model_cpus``: the CPUs of the CPU runner's thread.
    With :func:`simulator_plan`, the one place that reads the device kind."""
    simulator_plan(config, transport)  # the device can use the transport

    def load() -> tuple[Path, ModelContract]:
        path = config.model if config.model is not None else reference_model_path()
        return path, load_contract(path)

    path, contract = await run_in_thread(
        load, awaited="the model's contract", error=ModelTimeout, timeout=config.model_load_timeout
    )
    match config.device:
        case DeviceKind.CPU:
            async with _cpu(config, path, contract, model_cpus) as device:
                yield device
        case DeviceKind.SIM if transport is not None:
            async with _accelerator(config, contract, transport) as device:
                yield device
        case DeviceKind.SIM:
            async with (
                _simulated(config, path, contract, plan or FaultPlan()) as in_process,
                _accelerator(config, contract, in_process) as device,
            ):
                yield device


@contextlib.asynccontextmanager
async def _cpu(
    config: ServiceConfig, path: Path, contract: ModelContract, cpus: frozenset[int] | None
) -> AsyncIterator[Device]:
    runner = await OnnxRunner.open(
        path,
        timeout=config.model_load_timeout,
        intra_op_threads=config.intra_op_threads,
        cpus=cpus,
        contract=contract,  # checked as it was loaded: not run on zeros a second time
    )

    @contextlib.asynccontextmanager
    async def session(readiness: Readiness) -> AsyncIterator[ModelBackend]:
        for layer in (
            ReadinessLayer.DEVICE_ONLINE,
            ReadinessLayer.FIRMWARE_READY,
            ReadinessLayer.QUEUE_SUBMITTABLE,
        ):
            readiness.mark_up(layer)
        yield CpuBackend(runner)

    try:
        yield Device("cpu", contract, session, restartable=False)
    finally:
        runner.close()


@contextlib.asynccontextmanager
async def _accelerator(
    config: ServiceConfig, contract: ModelContract, opener: TransportOpener
) -> AsyncIterator[Device]:
    session_config = SessionConfig(
        kernel_timeout=config.gpu_hang_after,
        fence_timeout=config.fence_timeout,
        bulk_timeout=config.bulk_timeout,
    )
    probe_timeout = config.budget

    @contextlib.asynccontextmanager
    async def session(readiness: Readiness) -> AsyncIterator[ModelBackend]:
        usb: LentTransport | None = None
        try:
            with deadline_scope(config.device_open_timeout, name="accelerator open"):
                usb = await link.take()
                runner = await AcceleratorRunner.open(
                    usb,
                    image_size=MODEL_INPUT_SIZE,
                    output_size=contract.output_length,
                    config=session_config,
                    readiness=readiness,
                )
            backend = AcceleratorBackend(runner, kernel_timeout=config.gpu_hang_after)
            try:
                yield backend
            except Exception:
                # The session failed: a device that no longer answers is not waited for.
                if await runner.answers(timeout=probe_timeout):
                    await backend.aclose()
                else:
                    await runner.abandon()
                raise
            except BaseException:
                await backend.aclose()
                raise
            await backend.aclose()
        finally:
            if usb is not None:
                link.give_back(usb)

    async with AcceleratorLink(opener, probe_timeout=probe_timeout) as link:
        yield Device("accelerator", contract, session, restartable=True, probe=link.probe)


@contextlib.asynccontextmanager
async def _simulated(
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
