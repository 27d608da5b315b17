"""openpilot's per-frame driver-monitoring decisions, from one side's driver data.

The rules of openpilot's monitoring policy (spec dms-contract §2.3, §2.4, §2.6), evaluated on one
frame with no history: what a change of model would flip. Inputs are the fields of ``DriverData``
by their capnp names (``faceProb``, ``leftEyeProb`` ...), as a mapping or a capnp reader.

- face detected: ``faceProb`` > 0.7;
- eyes closed (the blink rule): each eye's ``*BlinkProb``, counted only while its ``*EyeProb`` >
  0.65 and ``sunglassesProb`` < 0.9, averaged over both eyes, > 0.865;
- phone: ``phoneProb`` > 0.5;
- distracted pose: the face's pitch and yaw (the orientation corrected for where the face sits in
  the reference camera's view, 1928 x 1208, focal 598.0) beyond the limits of a driver whose pose
  openpilot has not learnt yet — pitch error (looking down only) > 0.449 rad from the natural
  offset 0.011, |yaw error| > 0.5042 rad from 0.075 (the slack limit: no brake prediction, no
  steering), with the calibration's roll, pitch and yaw given (default all 0). On the right-hand
  side the yaw is mirrored.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

__all__ = [
    "BLINK_THRESHOLD",
    "DECISIONS",
    "EYE_THRESHOLD",
    "FACE_THRESHOLD",
    "PHONE_THRESHOLD",
    "SUNGLASSES_THRESHOLD",
    "decisions",
    "distracted_pose",
    "eyes_closed",
    "face_detected",
    "phone",
]

FACE_THRESHOLD = 0.7
EYE_THRESHOLD = 0.65
SUNGLASSES_THRESHOLD = 0.9
BLINK_THRESHOLD = 0.865
PHONE_THRESHOLD = 0.5
_PITCH_OFFSET, _PITCH_LIMIT = 0.011, 0.449
_YAW_OFFSET, _YAW_LIMIT = 0.075, 0.5042
_WIDTH, _HEIGHT, _FOCAL = 1928, 1208, 598.0

DECISIONS = ("faceDetected", "eyesClosed", "phone", "distractedPose")
"""The decisions :func:`decisions` makes, in order."""

Rpy = tuple[float, float, float]


def _get(data: Mapping[str, Any] | Any, name: str) -> Any:
    return data[name] if isinstance(data, Mapping) else getattr(data, name)


def face_detected(data: Mapping[str, Any] | Any) -> bool:
    return float(_get(data, "faceProb")) > FACE_THRESHOLD


def eyes_closed(data: Mapping[str, Any] | Any) -> bool:
    clear = float(_get(data, "sunglassesProb")) < SUNGLASSES_THRESHOLD
    blinks = [
        float(_get(data, f"{eye}BlinkProb"))
        * (float(_get(data, f"{eye}EyeProb")) > EYE_THRESHOLD)
        * clear
        for eye in ("left", "right")
    ]
    return sum(blinks) / 2 > BLINK_THRESHOLD


def phone(data: Mapping[str, Any] | Any) -> bool:
    return float(_get(data, "phoneProb")) > PHONE_THRESHOLD


def distracted_pose(
    data: Mapping[str, Any] | Any, *, right_hand: bool = False, rpy: Rpy = (0.0, 0.0, 0.0)
) -> bool:
    orientation = [float(v) for v in _get(data, "faceOrientation")]
    position = [float(v) for v in _get(data, "facePosition")]
    if len(orientation) < 2 or len(position) < 2:
        return False  # openpilot skips a frame without them
    pitch = orientation[0] + math.atan2(position[1] * _HEIGHT, _FOCAL) - rpy[1]
    yaw = -orientation[1] + math.atan2(position[0] * _WIDTH, _FOCAL) - rpy[2]
    if right_hand:
        yaw = -yaw
    pitch_error = min(pitch - _PITCH_OFFSET, 0.0)  # only looking down counts
    yaw_error = abs(yaw - _YAW_OFFSET)
    return abs(pitch_error) > _PITCH_LIMIT or yaw_error > _YAW_LIMIT


def decisions(
    data: Mapping[str, Any] | Any, *, right_hand: bool = False, rpy: Rpy = (0.0, 0.0, 0.0)
) -> tuple[bool, bool, bool, bool]:
    """(face detected, eyes closed, phone, distracted pose) for one side's driver data."""
    return (
        face_detected(data),
        eyes_closed(data),
        phone(data),
        distracted_pose(data, right_hand=right_hand, rpy=rpy),
    )
