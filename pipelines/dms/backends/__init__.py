"""Where the model runs: the model-backend seam (:mod:`.base`: the protocol, the device, and
:func:`~.base.open_device`), and one module a device kind — onnxruntime on the CPU (:mod:`.cpu`),
the accelerator (:mod:`.sim`: over USB transports given, or simulated in this process) — with
what they share: the accelerator's runner and session (:mod:`.accelerator`) and its USB link
(:mod:`.link`).

Here, the table of the device kinds (:data:`BACKENDS`): each row names its kind and its module
(imported only when the kind is used), which gives ``open_device(config, path, contract, *, plan,
transport, model_cpus)``, an async context manager yielding the open
:class:`~.base.Device`. Adding a backend is one module, one row and one
:class:`~pipelines.dms.config.kinds.DeviceKind` member.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType

from ..config.kinds import DeviceKind

__all__ = ["BACKENDS", "BackendKind", "backend_kind"]


@dataclass(frozen=True)
class BackendKind:
    """A kind of device the model runs on."""

    device: DeviceKind
    """The ``device`` setting that chooses it."""
    module: str
    """Its module, relative to this package: it gives ``open_device``."""

    def load(self) -> ModuleType:
        return importlib.import_module(self.module, __name__)


BACKENDS = (
    BackendKind(DeviceKind.SIM, ".sim"),
    BackendKind(DeviceKind.CPU, ".cpu"),
)
"""Every device kind, the default first."""


def backend_kind(device: DeviceKind) -> BackendKind:
    """The row of ``device``."""
    for kind in BACKENDS:
        if kind.device is device:
            return kind
    raise ValueError(f"no backend runs on device {device!r}")
