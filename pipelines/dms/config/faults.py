"""Scripted faults for the service (``aio-dms run --faults SPEC``).

``SPEC`` is a comma-separated list of ``NAME@FRAME[+FRAMES]``: fault ``NAME`` starts when frame
number ``FRAME`` (counted from 0 as frames reach the service) arrives and lasts ``FRAMES`` frames
(default 1). Example: ``gpu-hang@40+20,camera-stall@100+10``.

=================  ==========================================================================
``gpu-hang``       the accelerator's compute kernel never finishes (simulated device)
``usb-timeout``    USB transfers to the accelerator are never answered
``usb-disconnect`` the accelerator's USB bridge leaves the bus (and returns when the fault ends)
``fence-stall``    the copy engine never sees a copy-in chunk: the chunk fence stalls
``smu-timeout``    the SMU firmware never answers (it shows when the session reboots)
``camera-stall``   the camera delivers no frames
``nan-output``     the model's output is NaN
=================  ==========================================================================

The accelerator faults need ``--device sim``; with ``--device cpu`` they are refused.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from transports.sim import Fault

from ...echo import shown
from .text import Unexpected

__all__ = [
    "DEVICE_FAULTS",
    "FAULT_NAMES",
    "FaultSpec",
    "ServiceFault",
    "faults_value",
    "parse_faults",
]

DEVICE_FAULTS: dict[str, Fault] = {
    "gpu-hang": Fault.KERNEL_HANG,
    "usb-timeout": Fault.USB_TIMEOUT,
    "usb-disconnect": Fault.DISCONNECT,
    "fence-stall": Fault.SENTINEL_NEVER_CONSUMED,
    "smu-timeout": Fault.SMU_NO_RESPONSE,
}
"""Faults of the simulated accelerator, as the simulator's fault kinds."""


class ServiceFault(enum.StrEnum):
    """Faults the service itself plays (any device)."""

    CAMERA_STALL = "camera-stall"
    NAN_OUTPUT = "nan-output"


SERVICE_FAULTS = {fault.value: fault for fault in ServiceFault}
FAULT_NAMES = (*DEVICE_FAULTS, *(fault.value for fault in ServiceFault))

_ITEM = re.compile(r"(?P<name>[a-z-]+)@(?P<start>[0-9]+)(?:\+(?P<frames>[0-9]+))?")
"""One item; frame numbers in ASCII digits only (``\\d`` and ``int()`` take other scripts')."""
_FRAME_DIGITS = 18
"""Digits of a frame number at most (a frame number past 10**18 is no frame of a run)."""


@dataclass(frozen=True)
class FaultSpec:
    name: str
    start: int
    frames: int = 1

    def active(self, frame: int) -> bool:
        return self.start <= frame < self.start + self.frames

    @property
    def device(self) -> Fault | None:
        """The simulated accelerator's fault this is, if it is one."""
        return DEVICE_FAULTS.get(self.name)

    @property
    def service(self) -> ServiceFault | None:
        """The service's own fault this is, if it is one."""
        return SERVICE_FAULTS.get(self.name)


def faults_value(value: object) -> str | None:
    ok = isinstance(value, tuple) and all(isinstance(item, FaultSpec) for item in value)
    return None if ok else "must be fault specs (NAME@FRAME[+FRAMES], comma-separated)"


def parse_faults(spec: str) -> list[FaultSpec]:
    """Parse ``NAME@FRAME[+FRAMES],...`` (spaces around an item ignored; frame numbers in ASCII
    digits); a :class:`ValueError` for anything else, in one line naming the item at fault."""
    faults = []
    for item in filter(None, (part.strip() for part in spec.split(","))):
        match = _ITEM.fullmatch(item)
        if match is None or any(len(n or "") > _FRAME_DIGITS for n in match.group(2, 3)):
            raise Unexpected(
                "expected NAME@FRAME or NAME@FRAME+FRAMES (FRAME, FRAMES: at most "
                f"{_FRAME_DIGITS} ASCII digits), e.g. gpu-hang@40+20",
                item,
            )
        name = match["name"]
        if name not in FAULT_NAMES:
            raise ValueError(
                f"fault {shown(item)}: unknown fault {shown(name)}; known: {', '.join(FAULT_NAMES)}"
            )
        frames = int(match["frames"]) if match["frames"] is not None else 1
        if frames < 1:
            raise ValueError(f"fault {shown(item)}: it must last at least one frame")
        faults.append(FaultSpec(name, int(match["start"]), frames))
    return faults
