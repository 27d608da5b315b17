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

Each rule is written once, over numpy values: :func:`decisions` applies them to one frame,
:func:`decision_arrays` to many frames at once (one array a field), with the same results.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = [
    "BLINK_THRESHOLD",
    "DECISIONS",
    "EYE_THRESHOLD",
    "FACE_THRESHOLD",
    "PHONE_THRESHOLD",
    "SUNGLASSES_THRESHOLD",
    "WHEEL_ON_RIGHT_THRESHOLD",
    "decision_arrays",
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
WHEEL_ON_RIGHT_THRESHOLD = 0.5
"""openpilot monitors the right-hand side's driver when ``wheelOnRightProb`` is above this."""
_PITCH_OFFSET, _PITCH_LIMIT = 0.011, 0.449
_YAW_OFFSET, _YAW_LIMIT = 0.075, 0.5042
_WIDTH, _HEIGHT, _FOCAL = 1928, 1208, 598.0

DECISIONS = ("faceDetected", "eyesClosed", "phone", "distractedPose")
"""The decisions :func:`decisions` makes, in order."""

Rpy = tuple[float, float, float]
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]


def _get(data: Mapping[str, Any] | Any, name: str) -> Any:
    return data[name] if isinstance(data, Mapping) else getattr(data, name)


def _value(data: Mapping[str, Any] | Any, name: str) -> FloatArray:
    """A field as float64: a number (0-d) for one frame, an array for many."""
    return np.asarray(_get(data, name), dtype=np.float64)


def _elements(data: Mapping[str, Any] | Any, name: str) -> list[FloatArray]:
    """A list field's elements as float64: numbers for one frame, an array each for many."""
    return [np.asarray(v, dtype=np.float64) for v in _get(data, name)]


def _face_detected(data: Mapping[str, Any] | Any) -> BoolArray:
    return _value(data, "faceProb") > FACE_THRESHOLD


def _eyes_closed(data: Mapping[str, Any] | Any) -> BoolArray:
    clear = _value(data, "sunglassesProb") < SUNGLASSES_THRESHOLD
    blinks = [
        _value(data, f"{eye}BlinkProb") * (_value(data, f"{eye}EyeProb") > EYE_THRESHOLD) * clear
        for eye in ("left", "right")
    ]
    closed: BoolArray = (blinks[0] + blinks[1]) / 2 > BLINK_THRESHOLD
    return closed


def _phone(data: Mapping[str, Any] | Any) -> BoolArray:
    return _value(data, "phoneProb") > PHONE_THRESHOLD


def _distracted_pose(
    data: Mapping[str, Any] | Any, right_hand: bool | BoolArray, rpy: Rpy
) -> BoolArray:
    orientation = _elements(data, "faceOrientation")
    position = _elements(data, "facePosition")
    if len(orientation) < 2 or len(position) < 2:
        return np.zeros(np.shape(right_hand), dtype=bool)  # openpilot skips a frame without them
    pitch = orientation[0] + np.arctan2(position[1] * _HEIGHT, _FOCAL) - rpy[1]
    yaw = -orientation[1] + np.arctan2(position[0] * _WIDTH, _FOCAL) - rpy[2]
    yaw = np.where(right_hand, -yaw, yaw)
    pitch_error = np.minimum(pitch - _PITCH_OFFSET, 0.0)  # only looking down counts
    yaw_error = np.abs(yaw - _YAW_OFFSET)
    distracted: BoolArray = (np.abs(pitch_error) > _PITCH_LIMIT) | (yaw_error > _YAW_LIMIT)
    return distracted


def face_detected(data: Mapping[str, Any] | Any) -> bool:
    return bool(_face_detected(data))


def eyes_closed(data: Mapping[str, Any] | Any) -> bool:
    return bool(_eyes_closed(data))


def phone(data: Mapping[str, Any] | Any) -> bool:
    return bool(_phone(data))


def distracted_pose(
    data: Mapping[str, Any] | Any, *, right_hand: bool = False, rpy: Rpy = (0.0, 0.0, 0.0)
) -> bool:
    return bool(_distracted_pose(data, right_hand, rpy))


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


def decision_arrays(
    data: Mapping[str, Any],
    *,
    right_hand: bool | BoolArray = False,
    rpy: Rpy = (0.0, 0.0, 0.0),
) -> dict[str, BoolArray]:
    """The same rules over many frames at once, by name (:data:`DECISIONS`): ``data`` holds each
    field as an array, one value a frame (a list field as a sequence of such arrays, one per
    element); ``right_hand``: one value for all frames, or an array, one a frame. Each frame's
    decisions are those :func:`decisions` makes of it."""
    return dict(
        zip(
            DECISIONS,
            (
                _face_detected(data),
                _eyes_closed(data),
                _phone(data),
                _distracted_pose(data, right_hand, rpy),
            ),
            strict=True,
        )
    )
