"""The driver-monitoring (DMS) service: cabin camera -> warp -> model -> decode -> publish.

Implements openpilot's DMS chain (``dmonitoringmodeld``) on the runtime core, under per-frame
deadlines, with an honest availability state. The folders, in the chain's order:

- ``frames``: frames (NV12) and every source of them: synthetic, a video file, a recording, an
  openpilot route segment;
- ``model``: what the model takes and gives: its contract and metadata, the reference model, the
  warp to its input and the decode of its output;
- ``backends``: where the model runs: onnxruntime on the CPU, or the (simulated) accelerator;
- ``sinks``: where the messages go: subscriptions, files (JSON lines, rlog, Parquet), ZeroMQ and
  cereal sockets;
- ``service``: the chain itself, its availability, health and metrics;
- ``fleet`` and ``report``: replays of many recordings on Ray, and pictures of a run.

``config`` (every setting, declared once), ``openpilot`` (openpilot's formats), ``messages``
(the published message) and ``summary`` (a run's summary) are the shared vocabulary; the
``aio-dms`` commands are :mod:`pipelines.cli`'s.

What an embedding application needs is exported here, ``from pipelines.dms import DmsService,
ServiceConfig, ...``; each name is imported from its module when first asked for, so importing
this package (or any module of it) costs nothing of the service's.
"""

import importlib
import typing

if typing.TYPE_CHECKING:
    from aio_runtime import Availability, AvailabilityState, Reason, Transition

    from .backends.link import TransportOpener
    from .config.faults import FaultSpec, parse_faults
    from .config.kinds import CameraFile, DeviceKind, Mode, Synthetic
    from .config.settings import ServiceConfig
    from .frames.frame import Frame
    from .frames.recording import record_frames
    from .frames.replay import ReplayCamera
    from .frames.segment import SegmentCamera
    from .frames.source import CalibrationSample, FrameSource
    from .frames.synthetic import SyntheticCalibration, SyntheticCamera
    from .frames.video import VideoFileCamera
    from .messages import DriverStateV2
    from .service import BoundEndpoints, DmsService, StartupError, Summary
    from .service.endpoints import HealthState
    from .sinks.base import SubscriptionStalled

__all__ = [
    "Availability",
    "AvailabilityState",
    "BoundEndpoints",
    "CalibrationSample",
    "CameraFile",
    "DeviceKind",
    "DmsService",
    "DriverStateV2",
    "FaultSpec",
    "Frame",
    "FrameSource",
    "HealthState",
    "Mode",
    "Reason",
    "ReplayCamera",
    "SegmentCamera",
    "ServiceConfig",
    "StartupError",
    "SubscriptionStalled",
    "Summary",
    "Synthetic",
    "SyntheticCalibration",
    "SyntheticCamera",
    "Transition",
    "TransportOpener",
    "VideoFileCamera",
    "parse_faults",
    "record_frames",
]

_HOMES = {
    "aio_runtime": ("Availability", "AvailabilityState", "Reason", "Transition"),
    ".frames.frame": ("Frame",),
    ".frames.replay": ("ReplayCamera",),
    ".frames.recording": ("record_frames",),
    ".frames.source": ("CalibrationSample", "FrameSource"),
    ".frames.synthetic": ("SyntheticCalibration", "SyntheticCamera"),
    ".frames.video": ("VideoFileCamera",),
    ".config.kinds": ("CameraFile", "DeviceKind", "Mode", "Synthetic"),
    ".config.settings": ("ServiceConfig",),
    ".service.endpoints": ("HealthState",),
    ".config.faults": ("FaultSpec", "parse_faults"),
    ".messages": ("DriverStateV2",),
    ".frames.segment": ("SegmentCamera",),
    ".sinks.base": ("SubscriptionStalled",),
    ".service": ("BoundEndpoints", "DmsService", "StartupError", "Summary"),
    ".backends.link": ("TransportOpener",),
}
_HOME_OF = {name: module for module, names in _HOMES.items() for name in names}

if not typing.TYPE_CHECKING:  # to type checkers, the names are the imports above

    def __getattr__(name: str) -> object:
        module = _HOME_OF.get(name)
        if module is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module, __name__), name)
        globals()[name] = value  # asked for once
        return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
