"""The published message: openpilot's ``driverStateV2`` plus what openpilot lacks.

Field names follow openpilot's schema (spec dms-contract §1.8, camelCase): ``frameId``,
``modelExecutionTime``, ``gpuExecutionTime``, ``wheelOnRightProb``, ``leftDriverData``,
``rightDriverData`` (each ``faceOrientation``, ``faceOrientationStd``, ``facePosition``,
``facePositionStd``, ``faceProb``, ``leftEyeProb``, ``rightEyeProb``, ``leftBlinkProb``,
``rightBlinkProb``, ``sunglassesProb``, ``phoneProb``, ``sleepProb``) and ``rawPredictions`` (only
when enabled: base64 of the little-endian float32 output). Added here:

- ``seq``: a sequence number per publisher, from 0, so a subscriber sees what it missed;
- ``runId``: which run of the service published it — the same in every message of one run (a
  service's start), and different in every run: given (``ServiceConfig.run_id``, ``--run-id``), or
  made fresh by :func:`new_run_id`, the UTC time of the start and a random suffix
  (``20250612T101530.123Z-3f9a1c2b``), so that run ids sort by when the runs started;
- ``timestampSof`` / ``timestampEof``: the frame's start/end-of-frame times (ns, camera clock);
- ``recordedTimestampSof`` / ``recordedTimestampEof``: for a replayed frame only, the times it had
  when it was recorded (its ``timestampSof`` / ``timestampEof`` are re-timed onto the service's
  clock);
- ``frameAge``: seconds from start of frame to publication;
- ``availability`` (``available`` / ``degraded`` / ``unavailable``; in Python the
  :class:`~aio_runtime.Availability` member, as transitions carry it), ``reason`` (empty when there
  is none) and ``reasonKind`` (the reason's kind, e.g. ``gpu-queue``; null when there is none);
- ``readiness``: the five readiness layers (device online, firmware ready, queue submittable,
  task complete, output valid), each true or false;
- ``valid``: true only when the output and the calibration were valid and the frame's age at
  publication within the staleness bound (``stale_after``), whatever the availability (design
  C13). openpilot always sets ``valid`` true; here it is honest. An invalid message says why
  (``reason``, written ``"<kind>: <detail>"``) and carries no driver data when there was no
  trustworthy output (a valid message's is empty);
- ``availabilityReason`` and ``availabilityReasonKind``: why the service is not AVAILABLE (empty
  and null while it is), on every message, valid or not — e.g. ``overloaded: 12.5 of 20 Hz valid;
  ...`` beside valid frames: fewer frames, each good;
- ``late``: a valid frame published after its deadline (start of frame + ``budget``).

While no frames arrive (a stalled camera) a *status message* is published each stall period:
``frameId`` -1, both timestamps 0, ``frameAge`` the age of the newest frame, ``valid`` false and the
reason — so a consumer on any sink hears of the stall instead of silence.
"""

from __future__ import annotations

import base64
import datetime
import functools
import json
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

import numpy as np

from aio_runtime import Availability, Readiness, ReadinessLayer, Reason

__all__ = [
    "DRIVER_FIELDS",
    "READINESS_LAYERS",
    "READINESS_NAMES",
    "DriverStateV2",
    "new_run_id",
    "readiness_record",
]

_Encoded = TypeVar("_Encoded")

DRIVER_FIELDS = (
    "faceOrientation",
    "faceOrientationStd",
    "facePosition",
    "facePositionStd",
    "faceProb",
    "leftEyeProb",
    "rightEyeProb",
    "leftBlinkProb",
    "rightBlinkProb",
    "sunglassesProb",
    "phoneProb",
    "sleepProb",
)
"""The fields of openpilot's ``DriverData``, in schema order."""

READINESS_NAMES: Mapping[ReadinessLayer, str] = {
    ReadinessLayer.DEVICE_ONLINE: "deviceOnline",
    ReadinessLayer.FIRMWARE_READY: "firmwareReady",
    ReadinessLayer.QUEUE_SUBMITTABLE: "queueSubmittable",
    ReadinessLayer.TASK_COMPLETE: "taskComplete",
    ReadinessLayer.OUTPUT_VALID: "outputValid",
}
"""Each readiness layer's name in a message."""
READINESS_LAYERS = tuple(READINESS_NAMES.values())
"""The layers' names, lowest first."""


def readiness_record(readiness: Readiness) -> dict[str, bool]:
    """``{"deviceOnline": True, ...}``: the layers as a message carries them."""
    return {name: readiness.is_up(layer) for layer, name in READINESS_NAMES.items()}


def new_run_id() -> str:
    """A fresh run id: the UTC time now to the millisecond and 32 random bits, as
    ``YYYYMMDDTHHMMSS.mmmZ-xxxxxxxx`` (sorts by time; two runs in the same millisecond share one
    with a chance of 1 in 2**32)."""
    at = datetime.datetime.now(datetime.UTC)
    return f"{at:%Y%m%dT%H%M%S}.{at.microsecond // 1000:03d}Z-{secrets.token_hex(4)}"


@dataclass(frozen=True)
class DriverStateV2:
    """One frame's outcome, as published."""

    seq: int
    run_id: str
    frame_id: int
    timestamp_sof: int
    timestamp_eof: int
    frame_age: float
    availability: Availability
    reason: str
    valid: bool
    readiness: Mapping[str, bool]
    late: bool = False
    """A valid frame published after its deadline."""
    availability_reason: str = ""
    """Why the service is not AVAILABLE ("" while it is)."""
    model_execution_time: float = 0.0
    gpu_execution_time: float = 0.0
    """Seconds the model took on its device: the CPU runner's run, or on the accelerator from the
    kernel's doorbell until its output was back on the host."""
    wheel_on_right_prob: float | None = None
    left_driver_data: Mapping[str, Any] | None = None
    right_driver_data: Mapping[str, Any] | None = None
    raw_predictions: bytes | None = field(default=None, repr=False)
    """The model's flat float32 output (little-endian), only when raw predictions are enabled."""
    recorded_sof: int | None = None
    recorded_eof: int | None = None
    """A replayed frame's timestamps as recorded (ns); None for a live frame."""
    log_mono_time: int = 0
    """When it was published (ns, the service's monotonic clock): openpilot's
    ``Event.logMonoTime``. Not in the JSON record."""

    def __post_init__(self) -> None:
        if self.availability not in tuple(Availability):
            raise ValueError(
                f"availability must be available, degraded or unavailable, got {self.availability!r}"
            )
        object.__setattr__(self, "availability", Availability(self.availability))
        if not isinstance(self.run_id, str) or not self.run_id:
            raise ValueError(f"run_id must be a non-empty string, got {self.run_id!r}")
        missing = [name for name in READINESS_LAYERS if name not in self.readiness]
        if missing:
            raise ValueError(f"readiness lacks the layers {missing}")
        for side in (self.left_driver_data, self.right_driver_data):
            if side is not None and set(side) != set(DRIVER_FIELDS):
                raise ValueError(
                    f"driver data must have exactly the fields {list(DRIVER_FIELDS)}, "
                    f"got {sorted(side)}"
                )
        if self.valid and (self.left_driver_data is None or self.right_driver_data is None):
            raise ValueError("a valid message carries driver data for both sides")
        if self.late and not self.valid:
            raise ValueError("only a valid message is late (an invalid one says why it is not)")

    @property
    def reason_kind(self) -> str | None:
        """What the reason is about (:attr:`aio_runtime.Reason.kind`: ``gpu-queue``, ``camera``,
        ``frame budget``...); None when there is no reason."""
        return Reason.of(self.reason).kind if self.reason else None

    @property
    def availability_reason_kind(self) -> str | None:
        """What the availability's reason is about; None while AVAILABLE."""
        return Reason.of(self.availability_reason).kind if self.availability_reason else None

    def to_record(self) -> dict[str, Any]:
        """The JSON record (camelCase), the same for every sink."""
        record: dict[str, Any] = {
            "seq": self.seq,
            "runId": self.run_id,
            "frameId": self.frame_id,
            "timestampSof": self.timestamp_sof,
            "timestampEof": self.timestamp_eof,
            "frameAge": self.frame_age,
            "valid": self.valid,
            "late": self.late,
            "availability": self.availability.value,
            "reason": self.reason,
            "reasonKind": self.reason_kind,
            "availabilityReason": self.availability_reason,
            "availabilityReasonKind": self.availability_reason_kind,
            "readiness": {name: bool(self.readiness[name]) for name in READINESS_LAYERS},
            "modelExecutionTime": self.model_execution_time,
            "gpuExecutionTime": self.gpu_execution_time,
            "wheelOnRightProb": self.wheel_on_right_prob,
            "leftDriverData": _driver(self.left_driver_data),
            "rightDriverData": _driver(self.right_driver_data),
        }
        if self.recorded_sof is not None:
            record["recordedTimestampSof"] = self.recorded_sof
            record["recordedTimestampEof"] = self.recorded_eof
        if self.raw_predictions is not None:
            record["rawPredictions"] = base64.b64encode(self.raw_predictions).decode("ascii")
        return record

    def to_json(self) -> str:
        """The record as compact JSON, encoded once however many sinks ask for it."""
        return self._json

    @functools.cached_property
    def _json(self) -> str:
        return json.dumps(self.to_record(), separators=(",", ":"), allow_nan=False)

    def encoded(self, encoder: Callable[[DriverStateV2], _Encoded]) -> _Encoded:
        """What ``encoder`` makes of the message, made once however many sinks ask for it (a
        format's own module names its encoder: :func:`pipelines.dms.openpilot.events.events_of`)."""
        made = self._encodings
        if encoder not in made:
            made[encoder] = encoder(self)
        return cast(_Encoded, made[encoder])

    @functools.cached_property
    def _encodings(self) -> dict[Callable[[DriverStateV2], object], object]:
        return {}


def _driver(data: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if data is None:
        return None
    out: dict[str, Any] = {}
    for name in DRIVER_FIELDS:
        value = data[name]
        out[name] = float(value) if np.ndim(value) == 0 else [float(v) for v in value]
    return out
