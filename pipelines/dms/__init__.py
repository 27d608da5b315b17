"""The driver-monitoring (DMS) service: cabin camera -> warp -> model -> decode -> publish.

Implements openpilot's DMS chain (``dmonitoringmodeld``) on the runtime core, under per-frame
deadlines, with an honest availability state. Modules:

- ``camera``, ``camera_sources``, ``camera_video``, ``camera_replay`` (with ``recording``,
  ``recording_reader``): frames (NV12), the cabin cameras, and the synthetic, video-file and
  replay sources, and recordings; ``openpilot.segments`` (with ``openpilot.segment_log``):
  openpilot's route segments as a camera;
- ``warp``: the model's input image, as openpilot warps it;
- ``model``, ``model_metadata`` (with ``metadata_limits``, ``metadata_pickle``), ``model_runner``,
  ``reference_model``: the model contract (its metadata read within limits), the bundled reference
  model, onnxruntime on the CPU;
- ``accelerator``: the model on the simulated accelerator (through ``transports``);
- ``decode``: outputs to the driverStateV2 fields, validated;
- ``messages``, ``publish`` (with ``sinks_policy``, ``sinks_memory``, ``sinks_file``,
  ``sinks_jsonl``, ``sinks_rlog``, ``sinks_zmq`` and its ``sinks_zmq_gate``, ``sinks_cereal``):
  the published message and its sinks, each with its policy per mode;
- ``channels``: the slots between stages (latest-frame-wins live, hand-off replaying) and the
  frame accounting rule;
- ``endpoints``: health and metrics over HTTP;
- ``config`` (with ``config_kinds``, ``config_values``): every setting, declared once;
- ``faults``: scripted faults; ``service``: the service; ``run`` (with ``run_summary``,
  ``run_progress``): ``aio-dms run`` and ``replay``; ``run_record``: ``aio-dms record``;
- ``report``: ``aio-dms report``, pictures of a run; ``metrics``: the service's Prometheus series.

What an embedding application needs is exported here, ``from pipelines.dms import DmsService,
ServiceConfig, ...``; each name is imported from its module when first asked for, so importing
this package (or any module of it) costs nothing of the service's.
"""

import importlib
import typing

if typing.TYPE_CHECKING:
    from aio_runtime import Availability, AvailabilityState, Reason, Transition

    from .camera import Frame
    from .camera_replay import ReplayCamera
    from .camera_sources import CalibrationSample, FrameSource
    from .camera_synthetic import SyntheticCalibration, SyntheticCamera
    from .camera_video import VideoFileCamera
    from .config import CameraFile, DeviceKind, Mode, ServiceConfig, Synthetic
    from .endpoints import HealthState
    from .faults import FaultSpec, parse_faults
    from .messages import DriverStateV2
    from .openpilot.segments import SegmentCamera
    from .publish import SubscriptionStalled
    from .recording import record_frames
    from .service import BoundEndpoints, DmsService, StartupError, Summary
    from .service._backends import TransportOpener

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
    ".camera": ("Frame",),
    ".camera_replay": ("ReplayCamera",),
    ".recording": ("record_frames",),
    ".camera_sources": ("CalibrationSample", "FrameSource"),
    ".camera_synthetic": ("SyntheticCalibration", "SyntheticCamera"),
    ".camera_video": ("VideoFileCamera",),
    ".config": ("CameraFile", "DeviceKind", "Mode", "ServiceConfig", "Synthetic"),
    ".endpoints": ("HealthState",),
    ".faults": ("FaultSpec", "parse_faults"),
    ".messages": ("DriverStateV2",),
    ".openpilot.segments": ("SegmentCamera",),
    ".publish": ("SubscriptionStalled",),
    ".service": ("BoundEndpoints", "DmsService", "StartupError", "Summary"),
    ".service._backends": ("TransportOpener",),
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
