"""The model's backends' seam: one protocol (:class:`ModelBackend`), what a device is once open
(:class:`Device`), and :func:`open_device`, which loads the model and has the device kind's module
(a row of :data:`~pipelines.dms.backends.BACKENDS`) open the device: onnxruntime on the CPU
(:class:`~pipelines.dms.backends.cpu.CpuBackend`), or an accelerator session over any USB
transport (:class:`~pipelines.dms.backends.accelerator.AcceleratorBackend`).

The accelerator's sessions can fail; its :class:`Device` has a probe (does the bridge answer?) by
which its supervisor reopens it as soon as it is back (:mod:`.link`), and a session
that failed on a device that no longer answers is abandoned rather than closed: its close would
only wait out the bounds of transfers nobody answers.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import NamedTuple, Protocol

import numpy as np

from aio_runtime import ModelTimeout, Readiness, run_in_thread
from transports.sim import FaultPlan

from ..config.kinds import DeviceKind
from ..config.settings import ServiceConfig
from ..model.contract import ModelContract, load_contract
from ..model.reference import reference_model_path
from . import backend_kind
from .link import TransportOpener

__all__ = [
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
    The device kind's module, a row of :data:`~pipelines.dms.backends.BACKENDS`, opens it."""
    simulator_plan(config, transport)  # the device can use the transport

    def load() -> tuple[Path, ModelContract, ModuleType]:
        path = config.model if config.model is not None else reference_model_path()
        kind = backend_kind(config.device).load()  # its first import, off the event loop too
        return path, load_contract(path), kind

    path, contract, kind = await run_in_thread(
        load, awaited="the model's contract", error=ModelTimeout, timeout=config.model_load_timeout
    )
    async with kind.open_device(
        config, path, contract, plan=plan, transport=transport, model_cpus=model_cpus
    ) as device:
        yield device
