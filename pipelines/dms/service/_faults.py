"""Scripted faults, played by frame number (``aio-dms run --faults``).

The simulated accelerator's faults go into its fault plan when their first frame arrives and come
out when their last has passed; the service's own faults are asked for by the stages that play
them (the camera delivers nothing, the model's output is NaN). Nothing here compares names in the
frame's path: the script is sorted by kind once.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from aio_runtime import get_logger
from transports.sim import FaultPlan, FaultRule

from ..config.faults import FaultSpec, ServiceFault

__all__ = ["ServiceFaults"]

_log = get_logger(__name__)


class ServiceFaults:
    """The script's faults; ``plan``: the simulated accelerator's fault plan, when the model runs
    on one in this process (the device's faults need it: :class:`ValueError` otherwise)."""

    def __init__(self, script: Iterable[FaultSpec], plan: FaultPlan | None = None) -> None:
        script = tuple(script)
        self._device = [spec for spec in script if spec.device is not None]
        if self._device and plan is None:
            names = ", ".join(spec.name for spec in self._device)
            raise ValueError(f"{names}: accelerator faults need the simulated accelerator")
        self._stalls = [spec for spec in script if spec.service is ServiceFault.CAMERA_STALL]
        self._nan = [spec for spec in script if spec.service is ServiceFault.NAN_OUTPUT]
        self.plan = plan

    def frame_arrives(self, number: int) -> None:
        """Frame ``number`` arrives: the device faults that start or end with it do."""
        if self.plan is None:
            return
        for spec in self._device:
            assert spec.device is not None
            if number == spec.start:
                self.plan.add(FaultRule(spec.device, at=1, count=math.inf))
                _log.warning("fault injected", fault=spec.name, frame=number)
            elif number == spec.start + spec.frames:
                self.plan.clear(spec.device)
                _log.info("fault cleared", fault=spec.name, frame=number)

    def camera_stalled(self, number: int) -> bool:
        """The camera delivers nothing in place of frame ``number``."""
        return any(spec.active(number) for spec in self._stalls)

    def output_is_nan(self, number: int) -> bool:
        """The model's output for frame ``number`` is NaN."""
        return any(spec.active(number) for spec in self._nan)
